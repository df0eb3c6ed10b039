//! `kiln bench`: llama-bench style prefill (pp) and decode (tg) throughput.

use std::io::Write;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use kiln_gguf::Gguf;
use kiln_runtime::{Rng, SamplingParams, Session};
use serde::Serialize;

use super::common::{rate, ModelArgs, Progress, ENV_HELP};

/// Measure prefill and decode speed, like llama-bench.
///
/// Tests: `ppP` prefills P random tokens (BOS first) into an empty cache,
/// or after a DEPTH-token context (`ppP @ dDEPTH`, the context itself
/// untimed); `tgN` decodes N tokens greedily, ignoring end-of-generation,
/// after a 1-token (or DEPTH-token) prompt. Each test runs once untimed to
/// warm up, then REPS times; the result is the mean ± sample standard
/// deviation of tokens/s. -p, -n and -d take comma-separated lists; 0 skips
/// that kind of test. The text output is a markdown table, followed by the
/// load time and the peak resident memory (VmHWM).
#[derive(clap::Args)]
#[command(after_long_help = ENV_HELP)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt lengths of the prefill tests (comma-separated; 0 = none).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_name = "P",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,
    /// Token counts of the decode tests (comma-separated; 0 = none).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_name = "N",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub n_gen: Vec<usize>,
    /// Context depths the tests run after (comma-separated).
    #[arg(
        short = 'd',
        long = "n-depth",
        value_name = "DEPTH",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub depth: Vec<usize>,
    /// Timed repetitions of each test.
    #[arg(short = 'r', long = "repetitions", value_name = "REPS", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub reps: u32,
    /// Skip the untimed warm-up run of each test.
    #[arg(long)]
    pub no_warmup: bool,
    /// One line of JSON per test: {"test","n_prompt","n_gen","depth",
    /// "threads","reps","avg_ts","stddev_ts","samples_ts","load_s",
    /// "peak_rss_bytes", then model, model_size, model_params, backend,
    /// isa (the CPU kernels' instruction set, e.g. "amx")}.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Prefill,
    Decode,
}

struct Test {
    kind: Kind,
    /// Tokens prefilled or generated.
    n: usize,
    depth: usize,
}

impl Test {
    fn name(&self) -> String {
        let base = match self.kind {
            Kind::Prefill => format!("pp{}", self.n),
            Kind::Decode => format!("tg{}", self.n),
        };
        if self.depth > 0 {
            format!("{base} @ d{}", self.depth)
        } else {
            base
        }
    }
}

#[derive(Serialize)]
struct Line<'a> {
    test: String,
    n_prompt: usize,
    n_gen: usize,
    depth: usize,
    threads: usize,
    reps: u32,
    avg_ts: f64,
    stddev_ts: f64,
    samples_ts: &'a [f64],
    load_s: f64,
    peak_rss_bytes: Option<u64>,
    model: &'a str,
    model_size: u64,
    model_params: u64,
    backend: &'static str,
    /// The CPU kernels' instruction set, or the GPU's name.
    isa: &'a str,
}

/// What the table's model columns show.
struct ModelInfo {
    name: String,
    size: u64,
    params: u64,
}

impl ModelInfo {
    fn read(g: &Gguf) -> ModelInfo {
        let arch = g.get_str("general.architecture").unwrap_or("?");
        let size_label = g.get_str("general.size_label").ok();
        let ftype = g.get_u32("general.file_type").ok().and_then(ftype_name);
        let mut name = arch.to_string();
        for part in [size_label, ftype].into_iter().flatten() {
            name.push(' ');
            name.push_str(part);
        }
        let (mut size, mut params) = (0u64, 0u64);
        for t in g.tensor_infos() {
            size += t.n_bytes;
            params += t.dims.iter().product::<u64>();
        }
        ModelInfo { name, size, params }
    }
}

/// llama.cpp's `general.file_type` names (the common ones).
fn ftype_name(t: u32) -> Option<&'static str> {
    Some(match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        _ => return None,
    })
}

/// Peak resident set size (VmHWM) of this process, in bytes (Linux).
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Mean and sample standard deviation.
fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// `n` pseudo-random token ids (fixed seed), BOS first when `bos` is given.
fn random_ids(rng: &mut Rng, n: usize, n_vocab: usize, bos: Option<u32>) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..n)
        .map(|_| (rng.next_u64() % n_vocab as u64) as u32)
        .collect();
    if let (Some(b), Some(first)) = (bos, ids.first_mut()) {
        *first = b;
    }
    ids
}

fn fmt_bytes(b: u64) -> String {
    let b = b as f64;
    if b >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2} GiB", b / (1024.0 * 1024.0 * 1024.0))
    } else {
        format!("{:.2} MiB", b / (1024.0 * 1024.0))
    }
}

fn fmt_count(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2} B", n / 1e9)
    } else {
        format!("{:.2} M", n / 1e6)
    }
}

pub fn run(a: Args) -> Result<()> {
    let mut tests = Vec::new();
    for &depth in &a.depth {
        for &n in a.n_prompt.iter().filter(|&&n| n > 0) {
            tests.push(Test {
                kind: Kind::Prefill,
                n,
                depth,
            });
        }
        for &n in a.n_gen.iter().filter(|&&n| n > 0) {
            tests.push(Test {
                kind: Kind::Decode,
                n,
                depth,
            });
        }
    }
    if tests.is_empty() {
        bail!("nothing to benchmark: -p and -n are both 0");
    }
    let (mut session, _, load) = a.model.load(false)?;
    let detail = session.backend().detail();
    let info = ModelInfo::read(session.gguf());
    let threads = a.model.thread_count();
    let max_ctx = session.options().max_context;
    for t in &tests {
        // Decode needs the prompt (>= 1 token), n - 1 more steps and room
        // for the last one; prefill needs depth + n < the context.
        let need = match t.kind {
            Kind::Prefill => t.depth.saturating_add(t.n),
            Kind::Decode => t.depth.max(1).saturating_add(t.n),
        };
        if need >= max_ctx {
            bail!(
                "test {} needs {need} tokens of context, but it holds {max_ctx} (see --ctx)",
                t.name()
            );
        }
    }
    let n_vocab = session.config().n_vocab;
    let bos = session.tokenizer().bos_id();
    let mut rng = Rng::new(1234);
    let max_depth = a.depth.iter().copied().max().unwrap_or(0);
    let context = random_ids(&mut rng, max_depth.max(1), n_vocab, bos);
    let max_p = a.n_prompt.iter().copied().max().unwrap_or(0);
    let prompt = random_ids(&mut rng, max_p, n_vocab, None);

    let mut out = std::io::stdout().lock();
    if !a.json {
        writeln!(
            out,
            "| model | size | params | backend | threads | test | t/s |\n| --- | ---: | ---: | --- | ---: | ---: | ---: |"
        )?;
        out.flush()?;
    }
    let runs = a.reps as usize + usize::from(!a.no_warmup);
    for t in &tests {
        let spinner = Progress::spinner(format!("bench {}", t.name()));
        let mut samples = Vec::with_capacity(a.reps as usize);
        for rep in 0..runs {
            let (n, time) = match t.kind {
                Kind::Prefill => {
                    prefill_once(&mut session, &context[..t.depth], &prompt[..t.n], bos)?
                }
                Kind::Decode => decode_once(&mut session, &context[..t.depth.max(1)], t.n)?,
            };
            if rep + a.reps as usize >= runs {
                samples.push(rate(n, time));
            }
        }
        spinner.finish();
        let (avg, sd) = mean_sd(&samples);
        if a.json {
            let line = Line {
                test: t.name(),
                n_prompt: if t.kind == Kind::Prefill { t.n } else { 0 },
                n_gen: if t.kind == Kind::Decode { t.n } else { 0 },
                depth: t.depth,
                threads,
                reps: a.reps,
                avg_ts: avg,
                stddev_ts: sd,
                samples_ts: &samples,
                load_s: load.as_secs_f64(),
                peak_rss_bytes: peak_rss_bytes(),
                model: &info.name,
                model_size: info.size,
                model_params: info.params,
                backend: session.backend().kind(),
                isa: &detail,
            };
            serde_json::to_writer(&mut out, &line)?;
            writeln!(out)?;
        } else {
            writeln!(
                out,
                "| {} | {} | {} | {} | {threads} | {} | {avg:.2} ± {sd:.2} |",
                info.name,
                fmt_bytes(info.size),
                fmt_count(info.params),
                session.backend().kind(),
                t.name()
            )?;
        }
        out.flush()?;
    }
    if !a.json {
        let rss = peak_rss_bytes().map_or_else(|| "unknown".to_string(), fmt_bytes);
        writeln!(
            out,
            "\nload: {:.2} s, peak RSS: {rss}, {} kernels: {detail}",
            load.as_secs_f64(),
            session.backend().kind(),
        )?;
    }
    out.flush()?;
    Ok(())
}

/// One timed prefill of `prompt` after the untimed `context` (empty: from
/// an empty cache, with BOS replacing the first prompt token).
fn prefill_once(
    session: &mut Session,
    context: &[u32],
    prompt: &[u32],
    bos: Option<u32>,
) -> Result<(usize, Duration)> {
    session.reset();
    let mut ids = Vec::with_capacity(context.len() + prompt.len());
    ids.extend_from_slice(context);
    if !context.is_empty() {
        session.logits(context)?;
    }
    ids.extend_from_slice(prompt);
    if context.is_empty() {
        if let (Some(b), Some(first)) = (bos, ids.first_mut()) {
            *first = b;
        }
    }
    let t0 = Instant::now();
    // Extends the cached context: only the prompt's tokens are computed.
    session.logits(&ids)?;
    Ok((prompt.len(), t0.elapsed()))
}

/// `n` greedy decode steps after `prompt`, end-of-generation ignored.
fn decode_once(session: &mut Session, prompt: &[u32], n: usize) -> Result<(usize, Duration)> {
    let params = SamplingParams {
        max_tokens: n + 1,
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    // The first token comes from the prompt's logits; n steps follow.
    let gen = session.generate(prompt, &params, |_| ControlFlow::Continue(()))?;
    Ok((gen.stats.decode_tokens, gen.stats.decode_time))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_sample_sd() {
        let (m, s) = mean_sd(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(m, 2.5);
        assert!((s - (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert_eq!(mean_sd(&[7.0]), (7.0, 0.0));
    }

    #[test]
    fn test_names_follow_llama_bench() {
        let t = |kind, n, depth| Test { kind, n, depth }.name();
        assert_eq!(t(Kind::Prefill, 512, 0), "pp512");
        assert_eq!(t(Kind::Decode, 128, 0), "tg128");
        assert_eq!(t(Kind::Prefill, 512, 4096), "pp512 @ d4096");
    }

    #[test]
    fn peak_rss_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(peak_rss_bytes().is_some_and(|b| b > 0));
        }
    }
}
