//! A stand-in for the Hugging Face Hub on loopback, enough for `kiln pull`
//! and `-hf`: the model listing (`/api/models/REPO?blobs=true`), `resolve`
//! answering 302 to a file host on another address with `X-Linked-Etag`,
//! `X-Linked-Size` and `X-Repo-Commit`, and the file host serving ranges.
//! It records every request and can cut a file's first transfer halfway.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use sha2::{Digest, Sha256};

/// A file of a test repository.
pub struct HubFile {
    pub path: String,
    pub bytes: Vec<u8>,
    /// The sha256 the Hub announces (the bytes' own unless a test lies).
    pub sha256: String,
}

impl HubFile {
    pub fn new(path: &str, bytes: Vec<u8>) -> HubFile {
        let sha256 = sha256_hex(&bytes);
        HubFile {
            path: path.to_string(),
            bytes,
            sha256,
        }
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub auth: Option<String>,
    /// Whether it came to the file host (not the Hub's address).
    pub file_host: bool,
}

struct State {
    repos: HashMap<String, (String, Vec<HubFile>)>,
    /// Paths whose next file-host GET sends half the bytes, then closes.
    cut: Mutex<Vec<String>>,
    seen: Mutex<Vec<Seen>>,
    stop: AtomicBool,
    file_host: String,
}

/// The running server; stops when dropped.
pub struct TestHub {
    pub endpoint: String,
    state: Arc<State>,
    threads: Vec<JoinHandle<()>>,
    addrs: Vec<std::net::SocketAddr>,
}

impl TestHub {
    /// Serves `repos` (`(name, files)`) at `http://127.0.0.1:PORT`, files
    /// from `http://127.0.0.2:PORT2` (another origin: no token goes there).
    pub fn start(repos: Vec<(&str, Vec<HubFile>)>) -> TestHub {
        let hub = TcpListener::bind("127.0.0.1:0").expect("bind hub");
        let files = TcpListener::bind("127.0.0.2:0").expect("bind file host");
        let addrs = vec![hub.local_addr().unwrap(), files.local_addr().unwrap()];
        let repos = repos
            .into_iter()
            .enumerate()
            .map(|(i, (name, files))| (name.to_string(), (format!("{:040x}", 0xc0ffee + i), files)))
            .collect();
        let state = Arc::new(State {
            repos,
            cut: Mutex::new(Vec::new()),
            seen: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            file_host: format!("http://{}", addrs[1]),
        });
        let threads = [(hub, false), (files, true)]
            .into_iter()
            .map(|(listener, file_host)| {
                let state = state.clone();
                std::thread::spawn(move || {
                    for conn in listener.incoming() {
                        if state.stop.load(Ordering::SeqCst) {
                            break;
                        }
                        if let Ok(conn) = conn {
                            let state = state.clone();
                            std::thread::spawn(move || serve(&state, conn, file_host));
                        }
                    }
                })
            })
            .collect();
        TestHub {
            endpoint: format!("http://{}", addrs[0]),
            state,
            threads,
            addrs,
        }
    }

    /// The next transfer of `path` stops halfway.
    pub fn cut_next(&self, path: &str) {
        self.state.cut.lock().unwrap().push(path.to_string());
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    pub fn commit(&self, repo: &str) -> String {
        self.state.repos[repo].0.clone()
    }
}

impl Drop for TestHub {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        for a in &self.addrs {
            let _ = TcpStream::connect(a);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn serve(state: &State, mut conn: TcpStream, file_host: bool) {
    let mut reader = BufReader::new(conn.try_clone().expect("clone stream"));
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, target) = (
        parts.next().unwrap_or("").to_string(),
        parts.next().unwrap_or("").to_string(),
    );
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    state.seen.lock().unwrap().push(Seen {
        method: method.clone(),
        path: target.clone(),
        range: headers.get("range").cloned(),
        auth: headers.get("authorization").cloned(),
        file_host,
    });
    let head = method == "HEAD";
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let reply = if file_host {
        file_host_reply(state, path, headers.get("range"), head)
    } else if let Some(repo) = path.strip_prefix("/api/models/") {
        listing(state, repo, query)
    } else {
        resolve(state, path)
    };
    let Reply {
        status,
        headers,
        body,
        cut,
    } = reply;
    let mut out = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let _ = conn.write_all(out.as_bytes());
    if !head {
        let n = if cut { body.len() / 2 } else { body.len() };
        let _ = conn.write_all(&body[..n]);
    }
    let _ = conn.flush();
}

struct Reply {
    status: &'static str,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    cut: bool,
}

fn json_reply(status: &'static str, v: serde_json::Value) -> Reply {
    let body = v.to_string().into_bytes();
    Reply {
        status,
        headers: vec![
            ("Content-Type", "application/json".into()),
            ("Content-Length", body.len().to_string()),
        ],
        body,
        cut: false,
    }
}

fn not_found() -> Reply {
    json_reply(
        "404 Not Found",
        serde_json::json!({"error": "Repository not found"}),
    )
}

fn listing(state: &State, repo: &str, query: &str) -> Reply {
    let Some((commit, files)) = state.repos.get(repo) else {
        return not_found();
    };
    assert!(
        query.contains("blobs=true"),
        "listing without sizes: {query}"
    );
    let siblings: Vec<_> = files
        .iter()
        .map(|f| {
            serde_json::json!({
                "rfilename": f.path,
                "size": f.bytes.len(),
                "blobId": format!("{:040x}", f.bytes.len()),
                "lfs": {"sha256": f.sha256, "size": f.bytes.len(), "pointerSize": 134},
            })
        })
        .collect();
    json_reply(
        "200 OK",
        serde_json::json!({"id": repo, "sha": commit, "siblings": siblings}),
    )
}

/// `/OWNER/NAME/resolve/REV/FILE` -> 302 to the file host.
fn resolve(state: &State, path: &str) -> Reply {
    let found = path.split_once("/resolve/").and_then(|(repo, rest)| {
        let (commit, files) = state.repos.get(repo.trim_start_matches('/'))?;
        let (rev, file) = rest.split_once('/')?;
        if rev != commit && rev != "main" {
            return None;
        }
        let f = files.iter().find(|f| f.path == file)?;
        Some((commit, f))
    });
    let Some((commit, f)) = found else {
        return not_found();
    };
    Reply {
        status: "302 Found",
        headers: vec![
            ("Location", format!("{}/cdn/{}", state.file_host, f.path)),
            ("X-Linked-Etag", format!("\"{}\"", f.sha256)),
            ("X-Linked-Size", f.bytes.len().to_string()),
            ("X-Repo-Commit", commit.clone()),
            ("ETag", "\"git-blob-id\"".into()),
            ("Content-Length", "0".into()),
        ],
        body: Vec::new(),
        cut: false,
    }
}

/// `/cdn/FILE`, with `Range: bytes=N-`.
fn file_host_reply(state: &State, path: &str, range: Option<&String>, head: bool) -> Reply {
    let file = path.trim_start_matches("/cdn/");
    let Some(f) = state
        .repos
        .values()
        .flat_map(|(_, files)| files)
        .find(|f| f.path == file)
    else {
        return not_found();
    };
    let from = range
        .and_then(|r| {
            r.strip_prefix("bytes=")?
                .strip_suffix('-')?
                .parse::<usize>()
                .ok()
        })
        .unwrap_or(0);
    let len = f.bytes.len();
    if from >= len && len > 0 {
        return Reply {
            status: "416 Range Not Satisfiable",
            headers: vec![
                ("Content-Range", format!("bytes */{len}")),
                ("Content-Length", "0".into()),
            ],
            body: Vec::new(),
            cut: false,
        };
    }
    let mut cut = false;
    if !head {
        let mut pending = state.cut.lock().unwrap();
        if let Some(i) = pending.iter().position(|p| p == file) {
            pending.remove(i);
            cut = true;
        }
    }
    let mut headers = vec![
        ("Content-Length", (len - from).to_string()),
        ("ETag", format!("\"{}\"", f.sha256)),
        ("Accept-Ranges", "bytes".into()),
    ];
    let status = if range.is_some() {
        headers.push(("Content-Range", format!("bytes {from}-{}/{len}", len - 1)));
        "206 Partial Content"
    } else {
        "200 OK"
    };
    Reply {
        status,
        headers,
        body: f.bytes[from..].to_vec(),
        cut,
    }
}
