//! `kiln pull`, `-hf`, `kiln list` and `kiln rm` against a stand-in Hub on
//! loopback serving the fixtures' GGUFs: the quant choice, downloads that
//! resume after a cut, checksum failures, split models, offline re-runs
//! and the errors users meet. No real network.

mod common;
#[path = "common/hub.rs"]
mod test_hub;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::TempDir;
use kiln_gguf::write::GgufWriter;
use kiln_gguf::{split_file_name, Gguf};
use test_hub::{sha256_hex, HubFile, TestHub};

const TINY: &str = "kiln-test/gemma3-tiny-GGUF";
const SPLIT: &str = "kiln-test/gemma2-tiny-GGUF";

fn fixture(rel: &str) -> Vec<u8> {
    std::fs::read(kiln_testdata::fixture(rel)).unwrap()
}

/// A repository of the gemma3-tiny fixture in three types, a README and a
/// vision projector (never a model).
fn tiny_repo() -> Vec<HubFile> {
    vec![
        HubFile::new("README.md", b"# tiny\n".to_vec()),
        HubFile::new(
            "gemma3-tiny-F32.gguf",
            fixture("gemma3-tiny/model-f32.gguf"),
        ),
        HubFile::new(
            "gemma3-tiny-F16.gguf",
            fixture("gemma3-tiny/model-f16.gguf"),
        ),
        HubFile::new(
            "gemma3-tiny-Q8_0.gguf",
            fixture("gemma3-tiny/model-q8_0.gguf"),
        ),
        HubFile::new("mmproj-gemma3-tiny-F16.gguf", vec![0; 100]),
    ]
}

/// gemma2-tiny F16 split in three parts, in a folder as the Hub's big
/// repositories keep them.
fn split_repo() -> Vec<HubFile> {
    let g = Gguf::from_bytes(fixture("gemma2-tiny/model-f16.gguf")).unwrap();
    let parts = GgufWriter::from_gguf(&g).to_split_bytes(3).unwrap();
    parts
        .into_iter()
        .enumerate()
        .map(|(i, b)| HubFile::new(&split_file_name("F16/gemma2-tiny-F16", i, 3), b))
        .collect()
}

/// `kiln ARGS` with the Hub at `endpoint` and the cache in `cache`.
fn kiln_cmd(cache: &Path, endpoint: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.args(args)
        .env("KILN_CACHE_DIR", cache)
        .env("HF_ENDPOINT", endpoint)
        .env_remove("HF_HUB_CACHE")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_TOKEN")
        .env_remove("KILN_MODEL");
    cmd
}

fn kiln(cache: &Path, endpoint: &str, args: &[&str]) -> Output {
    kiln_cmd(cache, endpoint, args).output().expect("run kiln")
}

fn ok(out: Output) -> (String, String) {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "kiln failed: {stderr}");
    (String::from_utf8(out.stdout).unwrap(), stderr)
}

/// Fails with one `error: ` line containing `needle`; returns it.
fn fails(out: Output, needle: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let last = stderr.lines().last().unwrap_or("");
    assert!(
        last.starts_with("error: ") && last.contains(needle),
        "{stderr}"
    );
    assert_eq!(stderr.matches("error: ").count(), 1, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    last.to_string()
}

/// Every file under `dir` (links followed), relative.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

fn blobs(cache: &Path, repo: &str) -> PathBuf {
    cache
        .join("models")
        .join(format!("models--{}", repo.replace('/', "--")))
        .join("blobs")
}

const RUN: &[&str] = &["run", "-p", "Hello", "-n", "4", "--temp", "0", "--json"];

fn run_ids(stdout: &str) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    v["ids"].clone()
}

/// `kiln run -hf HF` generates what `kiln run -m FIXTURE` does; returns
/// the ids.
fn run_hf_as_file(cache: &Path, endpoint: &str, hf: &str, fixture: &str) -> serde_json::Value {
    let (from_hub, _) = ok(kiln(cache, endpoint, &[RUN, &["-hf", hf]].concat()));
    let file = kiln_testdata::fixture(fixture);
    let (local, _) = ok(kiln(
        cache,
        endpoint,
        &[RUN, &["-m", file.to_str().unwrap()]].concat(),
    ));
    assert_eq!(run_ids(&from_hub), run_ids(&local));
    run_ids(&local)
}

/// `kiln chat ARGS -n 4 --temp 0` answering two lines; its stdout.
fn chat(cache: &Path, endpoint: &str, args: &[&str]) -> String {
    use std::io::Write;
    use std::process::Stdio;
    let mut cmd = kiln_cmd(
        cache,
        endpoint,
        &[&["chat", "-n", "4", "--temp", "0"], args].concat(),
    );
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"Hi!\nAnd again?\n").unwrap();
    drop(stdin);
    let (stdout, _) = ok(child.wait_with_output().unwrap());
    assert!(!stdout.trim().is_empty());
    stdout
}

#[test]
fn pull_picks_verifies_caches_and_runs_offline() {
    let cache = TempDir::new("hub-pull");
    let hub = TestHub::start(vec![(TINY, tiny_repo())]);
    // No QUANT and no Q4_K_M: the smallest model.
    let (stdout, _) = ok(kiln(&cache.0, &hub.endpoint, &["pull", TINY]));
    let path = PathBuf::from(stdout.trim());
    let commit = hub.commit(TINY);
    assert!(
        path.ends_with(format!("snapshots/{commit}/gemma3-tiny-Q8_0.gguf")),
        "{path:?}"
    );
    let q8 = fixture("gemma3-tiny/model-q8_0.gguf");
    assert_eq!(std::fs::read(&path).unwrap(), q8);
    assert_eq!(files_under(&blobs(&cache.0, TINY)), [sha256_hex(&q8)]);
    // The layout other Hub tools read.
    let repo_dir = cache.0.join("models/models--kiln-test--gemma3-tiny-GGUF");
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
        commit
    );
    // Listing and resolve went to the Hub, the bytes came from the file host.
    let seen = hub.seen();
    assert!(seen.iter().any(|s| s
        .path
        .starts_with("/api/models/kiln-test/gemma3-tiny-GGUF?")));
    assert!(seen.iter().any(|s| s.file_host && s.method == "GET"));

    // `run -hf` with a QUANT, case-insensitive, gives what `run -m` gives.
    let hf = format!("{TINY}:f16");
    let local = run_hf_as_file(&cache.0, &hub.endpoint, &hf, "gemma3-tiny/model-f16.gguf");

    // A second run needs no server.
    let endpoint = hub.endpoint.clone();
    drop(hub);
    let (again, stderr) = ok(kiln(&cache.0, &endpoint, &[RUN, &["--hf", &hf]].concat()));
    assert_eq!(run_ids(&again), local, "{stderr}");
    let (_, stderr) = ok(kiln(&cache.0, &endpoint, &["inspect", "-hf", TINY]));
    assert!(!stderr.contains("downloading"), "{stderr}");
    let (tok, _) = ok(kiln(
        &cache.0,
        &endpoint,
        &["tokenize", "-hf", &hf, "Hello"],
    ));
    assert!(!tok.trim().is_empty());
    // `chat` renders the GGUF's own template, with no flags.
    let f16 = kiln_testdata::fixture("gemma3-tiny/model-f16.gguf");
    assert_eq!(
        chat(&cache.0, &endpoint, &["-hf", &hf]),
        chat(&cache.0, &endpoint, &["-m", f16.to_str().unwrap()])
    );

    // `kiln list` shows both, with sizes; `kiln rm` removes one.
    let (list, _) = ok(kiln(&cache.0, &endpoint, &["list"]));
    assert!(list.contains(&format!("{TINY}:Q8_0")), "{list}");
    assert!(list.contains(&format!("{TINY}:F16")), "{list}");
    let (json, _) = ok(kiln(&cache.0, &endpoint, &["list", "--json"]));
    let items: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(items.as_array().unwrap().len(), 2);
    assert_eq!(items[1]["size"], q8.len());
    let (rm, _) = ok(kiln(&cache.0, &endpoint, &["rm", &format!("{TINY}:Q8_0")]));
    assert!(rm.starts_with(&format!("removed {TINY}:Q8_0")), "{rm}");
    let (json, _) = ok(kiln(&cache.0, &endpoint, &["list", "--json"]));
    let items: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(items.as_array().unwrap().len(), 1);
    assert_eq!(files_under(&blobs(&cache.0, TINY)).len(), 1);
    ok(kiln(&cache.0, &endpoint, &["rm", TINY]));
    assert!(!repo_dir.exists());
    fails(
        kiln(&cache.0, &endpoint, &["rm", TINY]),
        "is not in the cache",
    );
}

#[test]
fn a_cut_download_resumes_with_a_range() {
    let cache = TempDir::new("hub-resume");
    let hub = TestHub::start(vec![(TINY, tiny_repo())]);
    let f32 = fixture("gemma3-tiny/model-f32.gguf");
    let sha = sha256_hex(&f32);
    let pull_f32 = || {
        ok(kiln(
            &cache.0,
            &hub.endpoint,
            &["pull", &format!("{TINY}:F32")],
        ))
    };
    // Cut within the run: resumed by the next request.
    hub.cut_next("gemma3-tiny-F32.gguf");
    let (stdout, stderr) = pull_f32();
    assert!(stderr.contains("connection lost after"), "{stderr}");
    assert_eq!(sha256_hex(&std::fs::read(stdout.trim()).unwrap()), sha);
    let half = f32.len() / 2;
    let ranges: Vec<_> = hub
        .seen()
        .into_iter()
        .filter(|s| s.file_host)
        .filter_map(|s| s.range)
        .collect();
    assert_eq!(ranges, [format!("bytes={half}-")]);
    let (_, stderr) = pull_f32();
    assert!(stderr.contains("already in the cache"), "{stderr}");

    // A partial file left by an earlier run (killed halfway) resumes too.
    ok(kiln(&cache.0, &hub.endpoint, &["rm", TINY]));
    let dir = blobs(&cache.0, TINY);
    std::fs::create_dir_all(&dir).unwrap();
    let quarter = f32.len() / 4;
    std::fs::write(dir.join(format!("{sha}.incomplete")), &f32[..quarter]).unwrap();
    let (stdout, stderr) = pull_f32();
    assert!(stderr.contains("resuming at"), "{stderr}");
    assert_eq!(sha256_hex(&std::fs::read(stdout.trim()).unwrap()), sha);
    assert!(hub
        .seen()
        .iter()
        .any(|s| s.range == Some(format!("bytes={quarter}-"))));
    assert_eq!(files_under(&dir), std::slice::from_ref(&sha));

    // A corrupt partial file: detected at the end, downloaded afresh.
    ok(kiln(&cache.0, &hub.endpoint, &["rm", TINY]));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{sha}.incomplete")), vec![0xAB; quarter]).unwrap();
    let (stdout, stderr) = pull_f32();
    assert!(stderr.contains("partial download was corrupt"), "{stderr}");
    assert_eq!(sha256_hex(&std::fs::read(stdout.trim()).unwrap()), sha);
}

#[test]
fn a_wrong_checksum_is_rejected_and_removed() {
    let cache = TempDir::new("hub-checksum");
    let mut files = tiny_repo();
    files[3].sha256 = sha256_hex(b"something else");
    let hub = TestHub::start(vec![(TINY, files)]);
    let err = fails(
        kiln(&cache.0, &hub.endpoint, &["pull", &format!("{TINY}:Q8_0")]),
        "checksum mismatch for gemma3-tiny-Q8_0.gguf",
    );
    assert!(err.contains("the download was deleted"), "{err}");
    assert_eq!(files_under(&blobs(&cache.0, TINY)), Vec::<String>::new());
    let (list, _) = ok(kiln(&cache.0, &hub.endpoint, &["list", "--json"]));
    assert_eq!(list.trim(), "[]");
}

#[test]
fn split_models_download_whole_and_load_as_one() {
    let cache = TempDir::new("hub-split");
    let hub = TestHub::start(vec![(SPLIT, split_repo())]);
    let (stdout, _) = ok(kiln(
        &cache.0,
        &hub.endpoint,
        &["pull", &format!("{SPLIT}:f16")],
    ));
    assert!(
        stdout
            .trim()
            .ends_with("F16/gemma2-tiny-F16-00001-of-00003.gguf"),
        "{stdout}"
    );
    assert_eq!(files_under(&blobs(&cache.0, SPLIT)).len(), 3);
    run_hf_as_file(&cache.0, &hub.endpoint, SPLIT, "gemma2-tiny/model-f16.gguf");
    let (list, _) = ok(kiln(&cache.0, &hub.endpoint, &["list"]));
    assert!(
        list.contains(&format!("{SPLIT}:F16")) && list.contains("(+2 parts)"),
        "{list}"
    );
}

#[test]
fn errors_users_meet_are_one_clear_line() {
    let cache = TempDir::new("hub-errors");
    let hub = TestHub::start(vec![(TINY, tiny_repo())]);
    let e = &hub.endpoint;
    let err = fails(
        kiln(&cache.0, e, &["pull", &format!("{TINY}:Q4_K_M")]),
        "no Q4_K_M model in",
    );
    assert!(err.ends_with("available: F16, F32, Q8_0"), "{err}");
    fails(
        kiln(&cache.0, e, &["pull", "kiln-test/nope"]),
        "repository kiln-test/nope not found",
    );
    fails(
        kiln(&cache.0, e, &[RUN, &["-hf", "kiln-test/nope"]].concat()),
        "not found",
    );

    // The token goes to the Hub, never to the file host.
    let before = hub.seen().len();
    ok(kiln_cmd(&cache.0, e, &["pull", TINY])
        .env("HF_TOKEN", "hf_secret")
        .output()
        .unwrap());
    let seen = hub.seen().split_off(before);
    assert!(seen
        .iter()
        .filter(|s| !s.file_host)
        .all(|s| s.auth.as_deref() == Some("Bearer hf_secret")));
    assert!(seen
        .iter()
        .filter(|s| s.file_host)
        .all(|s| s.auth.is_none()));

    // No network: nothing listens there.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    fails(
        kiln(&cache.0, &closed, &["pull", "kiln-test/other"]),
        "cannot reach http://127.0.0.1:",
    );
    // Offline mode answers from the cache or says it cannot.
    let mut offline = kiln_cmd(&cache.0, e, &["pull", "kiln-test/other"]);
    fails(
        offline.env("HF_HUB_OFFLINE", "1").output().unwrap(),
        "HF_HUB_OFFLINE is set",
    );
    // A bad spec is a usage error.
    let out = kiln(&cache.0, e, &["pull", "a/b/c"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected OWNER/NAME[:QUANT]"));
}

/// A full disk stops the download with a line that says so and keeps the
/// partial file for a resume (`/dev/full` stands in for the disk).
#[cfg(target_os = "linux")]
#[test]
fn a_full_disk_is_reported() {
    let cache = TempDir::new("hub-full");
    let hub = TestHub::start(vec![(TINY, tiny_repo())]);
    let sha = sha256_hex(&fixture("gemma3-tiny/model-q8_0.gguf"));
    let dir = blobs(&cache.0, TINY);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink("/dev/full", dir.join(format!("{sha}.incomplete"))).unwrap();
    let err = fails(
        kiln(&cache.0, &hub.endpoint, &["pull", TINY]),
        "disk full writing",
    );
    assert!(
        err.ends_with("free some space and run again to resume"),
        "{err}"
    );
}
