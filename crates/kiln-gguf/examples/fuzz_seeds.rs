//! Writes seed inputs for the `gguf_parse` fuzz target (`scripts/fuzz` runs
//! it): for each GGUF given, a compact copy (metadata arrays cut to 8 items,
//! the first 6 tensors shrunk to one or two blocks), plus the malformed
//! variants of the first compact copy. Small seeds keep each run fast and
//! point the mutations at headers rather than weights.
//!
//! Usage: `fuzz_seeds OUT_DIR FILE.gguf...`

use std::process::ExitCode;

use kiln_gguf::write::GgufWriter;
use kiln_gguf::{malformed, Gguf, Value};

fn compact(g: &Gguf) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let mut w = GgufWriter::new();
    w.version(g.version());
    for (k, v) in g.metadata() {
        let mut v = v.clone();
        if let Value::Array(items) = &mut v {
            items.truncate(8);
        }
        w.metadata(k.clone(), v);
    }
    for t in g.tensor_infos().iter().take(6) {
        let block = t.ty.block_elems() as u64;
        let dims: Vec<u64> = if t.dims.len() > 1 {
            vec![block, 2]
        } else {
            vec![block]
        };
        let n = t.ty.bytes_for(dims.iter().product()).ok_or("tiny shape")? as usize;
        let view = g.tensor(&t.name).ok_or("listed tensor")?;
        let mut data = view.data[..n.min(view.data.len())].to_vec();
        data.resize(n, 0);
        w.tensor(t.name.clone(), &dims, t.ty, data)?;
    }
    Ok(w.to_bytes()?)
}

fn run() -> Result<usize, Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = std::path::PathBuf::from(
        args.next()
            .ok_or("usage: fuzz_seeds OUT_DIR FILE.gguf...")?,
    );
    std::fs::create_dir_all(&out)?;
    let mut n = 0;
    for (i, path) in args.enumerate() {
        let g = Gguf::open(&path).map_err(|e| format!("{path}: {e}"))?;
        let seed = compact(&g)?;
        if i == 0 {
            for m in malformed::variants(&seed)? {
                std::fs::write(out.join(format!("malformed-{}", m.name)), &m.bytes)?;
                n += 1;
            }
        }
        std::fs::write(out.join(format!("compact-{i}")), seed)?;
        n += 1;
    }
    Ok(n)
}

fn main() -> ExitCode {
    match run() {
        Ok(n) => {
            eprintln!("wrote {n} seeds");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
