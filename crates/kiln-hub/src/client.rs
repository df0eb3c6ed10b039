//! The Hub's HTTP API, as far as getting a model needs it:
//! `GET /api/models/REPO?blobs=true` (commit, files, sizes),
//! `HEAD /REPO/resolve/COMMIT/FILE` (the LFS sha256 in `X-Linked-Etag`, the
//! size in `X-Linked-Size`, a redirect to the file host) and a ranged `GET`
//! of the same URL. Redirects are followed here, not by the HTTP library,
//! so that the token goes only to the Hub's own host.

use std::time::Duration;

use serde::Deserialize;
use ureq::http::Response;
use ureq::Body;

use crate::error::{HubError, Result};
use crate::pick::RepoFile;

const MAX_REDIRECTS: usize = 10;

/// What the listing says about a repository.
#[derive(Debug)]
pub(crate) struct Listing {
    pub commit: String,
    pub files: Vec<RepoFile>,
    /// `(path, LFS sha256)` of the files stored in LFS.
    pub lfs: Vec<(String, String)>,
}

#[derive(Deserialize)]
struct ApiModel {
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<ApiSibling>,
}

#[derive(Deserialize)]
struct ApiSibling {
    rfilename: String,
    size: Option<u64>,
    lfs: Option<ApiLfs>,
}

#[derive(Deserialize)]
struct ApiLfs {
    sha256: String,
    size: Option<u64>,
}

/// A file's identity and size, from the `resolve` answer's headers.
#[derive(Debug)]
pub(crate) struct FileMeta {
    /// The LFS sha256 (64 hex digits) or, for a file not in LFS, its git
    /// blob id: the blob's name in the cache.
    pub etag: String,
    pub size: u64,
}

impl FileMeta {
    /// The sha256 to verify against (None: not an LFS file).
    pub fn sha256(&self) -> Option<&str> {
        (self.etag.len() == 64 && self.etag.bytes().all(|b| b.is_ascii_hexdigit()))
            .then_some(self.etag.as_str())
    }
}

pub(crate) struct Client {
    agent: ureq::Agent,
    endpoint: String,
    token: Option<String>,
}

impl Client {
    pub fn new(endpoint: &str, token: Option<String>) -> Client {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .max_redirects_will_error(false)
            .timeout_connect(Some(Duration::from_secs(20)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            // A stalled transfer fails (and resumes on the next try).
            .timeout_per_read(Some(Duration::from_secs(60)))
            .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Client {
            agent,
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
        }
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The repository's current commit and files.
    pub fn listing(&self, repo: &str) -> Result<Listing> {
        let url = format!("{}/api/models/{repo}?blobs=true", self.endpoint);
        let (resp, _) = self.send("GET", &url, None, MAX_REDIRECTS)?;
        let status = resp.status().as_u16();
        if status != 200 {
            return Err(self.status_error(repo, &url, resp));
        }
        let bad = |why: String| HubError::BadAnswer {
            url: url.clone(),
            why,
        };
        let text = resp
            .into_body()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(|e| bad(e.to_string()))?;
        let api: ApiModel = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let commit = api.sha.unwrap_or_else(|| "main".into());
        if !safe_component(&commit) {
            return Err(bad(format!("commit {commit:?}")));
        }
        let mut files = Vec::new();
        let mut lfs = Vec::new();
        for s in api.siblings {
            if !safe_path(&s.rfilename) {
                return Err(bad(format!("file name {:?}", s.rfilename)));
            }
            let size = s.lfs.as_ref().and_then(|l| l.size).or(s.size).unwrap_or(0);
            if let Some(l) = s.lfs {
                lfs.push((s.rfilename.clone(), l.sha256.to_ascii_lowercase()));
            }
            files.push(RepoFile {
                path: s.rfilename,
                size,
            });
        }
        Ok(Listing { commit, files, lfs })
    }

    /// The URL of a file at a commit.
    pub fn file_url(&self, repo: &str, commit: &str, file: &str) -> String {
        format!(
            "{}/{repo}/resolve/{commit}/{}",
            self.endpoint,
            file.split('/').map(encode).collect::<Vec<_>>().join("/")
        )
    }

    /// A file's etag and size: `HEAD` on its URL, up to the first answer
    /// that carries them (the Hub's redirect to the file host does).
    pub fn file_meta(&self, repo: &str, url: &str) -> Result<FileMeta> {
        let (resp, linked) = self.send("HEAD", url, None, MAX_REDIRECTS)?;
        let status = resp.status().as_u16();
        let meta = match linked {
            Some(m) => m,
            None if status == 200 => {
                let etag = header(&resp, "etag").map(unquote);
                let size = header(&resp, "content-length").and_then(|s| s.parse().ok());
                match (etag, size) {
                    (Some(etag), Some(size)) => FileMeta { etag, size },
                    _ => {
                        return Err(HubError::BadAnswer {
                            url: url.to_string(),
                            why: "no ETag or size for the file".into(),
                        })
                    }
                }
            }
            None => return Err(self.status_error(repo, url, resp)),
        };
        if !safe_component(&meta.etag) {
            return Err(HubError::BadAnswer {
                url: url.to_string(),
                why: format!("ETag {:?}", meta.etag),
            });
        }
        Ok(meta)
    }

    /// `GET url` from byte `from` on (redirects followed).
    pub fn get_from(&self, repo: &str, url: &str, from: u64) -> Result<Response<Body>> {
        let (resp, _) = self.send("GET", url, Some(from), MAX_REDIRECTS)?;
        match resp.status().as_u16() {
            200 | 206 | 416 => Ok(resp),
            _ => Err(self.status_error(repo, url, resp)),
        }
    }

    /// Sends a request, following up to `redirects` redirects; returns the
    /// last answer and the file metadata that any answer on the way gave
    /// in `X-Linked-Etag` / `X-Linked-Size` (a `HEAD` stops there).
    fn send(
        &self,
        method: &str,
        url: &str,
        range_from: Option<u64>,
        redirects: usize,
    ) -> Result<(Response<Body>, Option<FileMeta>)> {
        let mut url = url.to_string();
        let mut linked = None;
        for _ in 0..=redirects {
            let mut req = ureq::http::Request::builder().method(method).uri(&url);
            if let Some(from) = range_from.filter(|&f| f > 0) {
                req = req.header("Range", format!("bytes={from}-"));
            }
            if let Some(t) = self
                .token
                .as_ref()
                .filter(|_| origin(&url) == origin(&self.endpoint))
            {
                req = req.header("Authorization", format!("Bearer {t}"));
            }
            let req = req.body(()).map_err(|e| HubError::BadAnswer {
                url: url.clone(),
                why: e.to_string(),
            })?;
            let resp = self.agent.run(req).map_err(|e| HubError::Network {
                endpoint: origin(&url).to_string(),
                detail: e.to_string(),
            })?;
            let etag = header(&resp, "x-linked-etag").map(unquote);
            let size = header(&resp, "x-linked-size").and_then(|s| s.parse().ok());
            if let (Some(etag), Some(size), None) = (etag, size, &linked) {
                linked = Some(FileMeta { etag, size });
            }
            let location = header(&resp, "location");
            match location {
                Some(loc) if resp.status().is_redirection() => {
                    if method == "HEAD" && linked.is_some() {
                        return Ok((resp, linked));
                    }
                    url = join(&url, &loc);
                }
                _ => return Ok((resp, linked)),
            }
        }
        Err(HubError::BadAnswer {
            url,
            why: format!("more than {redirects} redirects"),
        })
    }

    /// The error for an unexpected status (the Hub's `error` text added).
    fn status_error(&self, repo: &str, url: &str, resp: Response<Body>) -> HubError {
        let status = resp.status().as_u16();
        match status {
            401 | 404 => HubError::RepoNotFound {
                repo: repo.to_string(),
                endpoint: self.endpoint.clone(),
            },
            403 => HubError::Denied {
                repo: repo.to_string(),
                status,
            },
            _ => {
                let text = resp
                    .into_body()
                    .with_config()
                    .limit(64 << 10)
                    .read_to_string()
                    .unwrap_or_default();
                let error = serde_json::from_str::<serde_json::Value>(&text)
                    .ok()
                    .and_then(|v| v.get("error")?.as_str().map(str::to_string));
                HubError::Http {
                    url: url.to_string(),
                    status,
                    detail: error.map_or_else(String::new, |e| format!(": {e}")),
                }
            }
        }
    }
}

pub(crate) fn header(resp: &Response<Body>, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// An ETag without its weak marker and quotes.
fn unquote(s: String) -> String {
    let s = s.trim();
    s.strip_prefix("W/")
        .unwrap_or(s)
        .trim_matches('"')
        .to_string()
}

/// `scheme://host[:port]` of a URL.
fn origin(url: &str) -> &str {
    let start = url.find("://").map_or(0, |i| i + 3);
    match url[start..].find('/') {
        Some(i) => &url[..start + i],
        None => url,
    }
}

/// A redirect's `Location` resolved against the URL that gave it.
fn join(base: &str, loc: &str) -> String {
    if loc.contains("://") {
        loc.to_string()
    } else if let Some(rest) = loc.strip_prefix("//") {
        let scheme = base.split("://").next().unwrap_or("https");
        format!("{scheme}://{rest}")
    } else if loc.starts_with('/') {
        format!("{}{loc}", origin(base))
    } else {
        let path = base.split(['?', '#']).next().unwrap_or(base);
        let dir = &path[..path.rfind('/').map_or(path.len(), |i| i + 1)];
        format!("{dir}{loc}")
    }
}

/// Percent-encodes a path segment (unreserved characters kept).
fn encode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A name safe as one cache path component (commits, etags).
pub(crate) fn safe_component(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A repository file path safe to recreate under a snapshot folder.
fn safe_path(p: &str) -> bool {
    !p.is_empty()
        && p.split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains(['\\', '\0']))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_resolve_against_their_url() {
        let base = "https://hf.co/o/r/resolve/main/m.gguf?x=1";
        assert_eq!(join(base, "https://cdn.x/a?sig=1"), "https://cdn.x/a?sig=1");
        assert_eq!(join(base, "//cdn.x/a"), "https://cdn.x/a");
        assert_eq!(join(base, "/api/x"), "https://hf.co/api/x");
        assert_eq!(
            join(base, "n.gguf"),
            "https://hf.co/o/r/resolve/main/n.gguf"
        );
        assert_eq!(origin("http://127.0.0.1:9/a/b"), "http://127.0.0.1:9");
        assert_eq!(origin("http://h"), "http://h");
    }

    #[test]
    fn names_that_could_escape_the_cache_are_refused() {
        for bad in ["", "..", ".", "a/b", "a b", "x\0"] {
            assert!(!safe_component(bad), "{bad:?}");
        }
        assert!(safe_component("0123abcdef"));
        for bad in ["", "../x.gguf", "a//b", "/abs", "a/./b", "a\\b"] {
            assert!(!safe_path(bad), "{bad:?}");
        }
        assert!(safe_path("Q4_K_M/m-Q4_K_M-00001-of-00002.gguf"));
        assert_eq!(encode("a b+c.gguf"), "a%20b%2Bc.gguf");
        assert_eq!(unquote("W/\"abc\"".into()), "abc");
    }
}
