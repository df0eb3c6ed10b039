//! Prints a GGUF file's metadata and tensors (a quick debugging aid).
fn main() {
    let path = std::env::args().nth(1).expect("usage: dump FILE.gguf");
    match kiln_gguf::Gguf::open(&path) {
        Ok(g) => {
            for (k, v) in g.metadata() {
                println!("{k} = {v}");
            }
            for t in g.tensor_infos() {
                println!("{} {:?} {} @{}", t.name, t.dims, t.ty, t.offset);
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
