use std::path::PathBuf;

/// Everything that can go wrong getting a model; each message is one line
/// that says what to do.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("bad model {spec:?}: {why}")]
    BadSpec { spec: String, why: String },
    #[error("cannot reach {endpoint}: {detail} (no network? HF_ENDPOINT sets the Hub's address)")]
    Network { endpoint: String, detail: String },
    #[error("repository {repo} not found on {endpoint} (if it is private or gated, set HF_TOKEN)")]
    RepoNotFound { repo: String, endpoint: String },
    #[error("access to {repo} denied ({status}): accept its terms on the model page, or set HF_TOKEN to a token that may read it")]
    Denied { repo: String, status: u16 },
    #[error("{url}: HTTP {status}{detail}")]
    Http {
        url: String,
        status: u16,
        detail: String,
    },
    #[error("{url}: bad answer from the Hub: {why}")]
    BadAnswer { url: String, why: String },
    #[error("{repo} has no GGUF model files")]
    NoGguf { repo: String },
    #[error("no {quant} model in {repo}; available: {}", available.join(", "))]
    QuantNotFound {
        repo: String,
        quant: String,
        available: Vec<String>,
    },
    #[error("{quant} names several models in {repo}: {}; give the file name after ':'", files.join(", "))]
    AmbiguousQuant {
        repo: String,
        quant: String,
        files: Vec<String>,
    },
    #[error("checksum mismatch for {file}: expected sha256 {expected}, got {got}; the download was deleted, run again to fetch it afresh")]
    Checksum {
        file: String,
        expected: String,
        got: String,
    },
    #[error("downloading {file}: {detail} after {done} of {total} bytes; run again to resume")]
    Interrupted {
        file: String,
        done: u64,
        total: u64,
        detail: String,
    },
    #[error("disk full writing {path} ({done} of {total} bytes); free some space and run again to resume")]
    DiskFull {
        path: PathBuf,
        done: u64,
        total: u64,
    },
    #[error("{spec} is not in the cache ({root}) and HF_HUB_OFFLINE is set")]
    Offline { spec: String, root: PathBuf },
    #[error("{spec} is not in the cache ({root}); `kiln list` shows what is")]
    NotCached { spec: String, root: PathBuf },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl HubError {
    /// An I/O error on `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> HubError {
        HubError::Io {
            path: path.into(),
            source,
        }
    }
}

pub type Result<T, E = HubError> = std::result::Result<T, E>;
