//! `kiln serve` end to end on the real 270M model: the official `openai`
//! Python client and raw HTTP (crates/kiln-server/tests/python), the
//! README's curl and Python examples as written, a bounded load test, and
//! a clean exit on SIGTERM. Every server listens on 127.0.0.1 only.
//!
//! Python packages are pinned and installed into a virtualenv under
//! Cargo's target tmpdir (once; later runs reuse it).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Python packages the tests use, pinned.
const PIP_PINS: &[&str] = &["openai==2.8.1", "pytest==8.4.2", "jsonschema==4.26.0"];

fn python_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../kiln-server/tests/python")
}

/// A virtualenv with [`PIP_PINS`] installed; its python.
fn venv_python() -> PathBuf {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-serve-venv");
    let python = venv.join("bin/python");
    let marker = venv.join("pins.txt");
    let pins = PIP_PINS.join("\n");
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(pins.as_str()) {
        return python;
    }
    let ok = Command::new("python3")
        .args(["-m", "venv", "--clear"])
        .arg(&venv)
        .status()
        .expect("python3 -m venv");
    assert!(ok.success(), "creating the virtualenv failed");
    let ok = Command::new(&python)
        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
        .args(PIP_PINS)
        .status()
        .expect("pip install");
    assert!(ok.success(), "pip install {PIP_PINS:?} failed");
    std::fs::write(&marker, pins).expect("write the venv marker");
    python
}

/// A running `kiln serve`; killed on drop unless it was stopped.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    /// Starts `kiln serve -m MODEL --port PORT ARGS...` and waits until
    /// /health says ready.
    fn start(port: u16, args: &[&str]) -> Server {
        Self::start_model(&kiln_testdata::real_model(), port, args)
    }

    /// [`start`](Self::start) with another model file.
    fn start_model(model: &Path, port: u16, args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["serve", "-m"])
            .arg(model)
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "-t",
                "2",
            ])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kiln serve");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let url = loop {
            let line = lines
                .next()
                .expect("kiln serve exited before listening")
                .expect("read stderr");
            if let Some(rest) = line.split("listening on ").nth(1) {
                break rest
                    .split_whitespace()
                    .next()
                    .expect("an address")
                    .to_owned();
            }
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            lines.for_each(|l| eprintln!("[server] {}", l.unwrap_or_default()))
        });
        let server = Server { child, url };
        let t0 = Instant::now();
        while server.get("/health").0 != 200 {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the server did not get ready"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// (status, body) of a GET.
    fn get(&self, path: &str) -> (u16, String) {
        let addr = self.url.trim_start_matches("http://");
        let Ok(mut s) = TcpStream::connect(addr) else {
            return (0, String::new());
        };
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        if s.write_all(req.as_bytes()).is_err() {
            return (0, String::new());
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let status = out
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, out)
    }

    /// SIGTERM, then the exit must be clean within the shutdown grace.
    fn terminate(mut self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(ok.success());
        let t0 = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(
                    status.success(),
                    "kiln serve exited with {status} on SIGTERM"
                );
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "no exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_python(python: &Path, args: &[&str], env: &[(&str, &str)]) {
    let status = Command::new(python)
        .args(args)
        .current_dir(python_dir())
        .envs(env.iter().copied())
        .status()
        .expect("run python");
    assert!(status.success(), "python {args:?} failed");
}

/// Extracts the README's server examples (the fenced blocks after the
/// `<!-- serve-examples -->` marker) as (language, code).
fn readme_examples() -> Vec<(String, String)> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .expect("README.md");
    let section = readme
        .split("<!-- serve-examples -->")
        .nth(1)
        .expect("the README's serve-examples marker");
    let section = section
        .split("<!-- /serve-examples -->")
        .next()
        .unwrap_or(section);
    let mut out = Vec::new();
    let mut lines = section.lines();
    while let Some(l) = lines.next() {
        if let Some(lang) = l.strip_prefix("```").filter(|l| !l.is_empty()) {
            let code: Vec<&str> = lines
                .by_ref()
                .take_while(|l| !l.starts_with("```"))
                .collect();
            out.push((lang.to_owned(), code.join("\n")));
        }
    }
    out
}

#[test]
fn kiln_serve_end_to_end() {
    let python = venv_python();
    let kiln = env!("CARGO_BIN_EXE_kiln");
    let model = kiln_testdata::real_model();
    let model = model.to_str().expect("UTF-8 model path");

    // The openai client and raw HTTP, against a main and a limited server.
    let main = Server::start(0, &["--parallel", "8", "--api-key", "test-key"]);
    let small = Server::start(
        0,
        &[
            "--parallel",
            "1",
            "--queue",
            "1",
            "--ctx",
            "64",
            "--max-body",
            "4096",
        ],
    );
    run_python(
        &python,
        &[
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "test_openai.py",
        ],
        &[
            ("KILN_URL", &main.url),
            ("KILN_SMALL_URL", &small.url),
            ("KILN_API_KEY", "test-key"),
            ("KILN_BIN", kiln),
            ("KILN_MODEL_PATH", model),
        ],
    );
    drop(small);

    // Structured output, tools and thinking: the real model and the tiny
    // Gemma 4 fixture (random weights: only the constraint keeps it valid).
    let g4 = Server::start_model(
        &kiln_testdata::fixture("gemma4-tiny/model-f32.gguf"),
        0,
        &["--parallel", "8"],
    );
    run_python(
        &python,
        &[
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "test_structured.py",
        ],
        &[
            ("KILN_URL", &main.url),
            ("KILN_API_KEY", "test-key"),
            ("KILN_G4_URL", &g4.url),
        ],
    );
    g4.terminate();
    main.terminate();

    // The README's examples, as written, on the default 127.0.0.1:8080.
    let readme = Server::start(8080, &[]);
    let examples = readme_examples();
    assert!(examples.iter().any(|(l, _)| l == "sh") && examples.iter().any(|(l, _)| l == "python"));
    for (lang, code) in &examples {
        let status = match lang.as_str() {
            "sh" => Command::new("bash")
                .args(["-euo", "pipefail", "-c", code])
                .status(),
            "python" => Command::new(&python).args(["-c", code]).status(),
            _ => continue,
        }
        .expect("run a README example");
        assert!(status.success(), "README example failed:\n{code}");
    }
    readme.terminate();

    // Load, reduced for CI's time budget (the README gives the full run).
    let load = Server::start(0, &["--parallel", "8", "--kv-budget", "96M"]);
    let pid = load.child.id().to_string();
    run_python(
        &python,
        &[
            "load_test.py",
            "--url",
            &load.url,
            "--pid",
            &pid,
            "--requests",
            "100",
            "--warmup",
            "64",
        ],
        &[],
    );
    load.terminate();
}
