//! The model cache, in the Hugging Face Hub's layout so that other tools
//! can share it:
//!
//! ```text
//! ROOT/models--OWNER--NAME/blobs/SHA256              a file's bytes
//! ROOT/models--OWNER--NAME/blobs/SHA256.incomplete   a download in progress
//! ROOT/models--OWNER--NAME/refs/main                 the commit last pulled
//! ROOT/models--OWNER--NAME/snapshots/COMMIT/FILE     -> ../../blobs/SHA256
//! ROOT/.locks/models--OWNER--NAME/SHA256.lock        held while downloading
//! ```
//!
//! A file is in the cache once its snapshot link resolves: blobs appear
//! only complete and verified (renamed from `.incomplete`), so a partial
//! download never looks like a model.

use std::path::{Path, PathBuf};

use crate::error::{HubError, Result};
use crate::pick::{candidates, choose, Candidate, RepoFile};
use crate::spec::ModelSpec;

/// A cached model: which repository, its files and where the first is.
#[derive(Clone, Debug)]
pub struct CachedModel {
    pub repo: String,
    pub model: Candidate,
    /// The first (or only) file, to open.
    pub path: PathBuf,
    /// The snapshot folder its files are linked in.
    pub snapshot: PathBuf,
}

impl CachedModel {
    /// `REPO:QUANT`, as `-hf` and `kiln rm` take it.
    pub fn spec(&self) -> String {
        format!("{}:{}", self.repo, self.model.quant())
    }
}

/// A cache folder (see the module doc).
#[derive(Clone, Debug)]
pub struct Cache {
    root: PathBuf,
}

impl Cache {
    pub fn new(root: impl Into<PathBuf>) -> Cache {
        Cache { root: root.into() }
    }

    /// `$HF_HUB_CACHE` (the cache other Hub tools use), else
    /// `$KILN_CACHE_DIR/models`, else `~/.cache/kiln/models`.
    pub fn from_env() -> Cache {
        if let Some(d) = std::env::var_os("HF_HUB_CACHE").filter(|d| !d.is_empty()) {
            return Cache::new(d);
        }
        let base = match std::env::var_os("KILN_CACHE_DIR").filter(|d| !d.is_empty()) {
            Some(d) => PathBuf::from(d),
            None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/kiln"),
        };
        Cache::new(base.join("models"))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn repo_folder(repo: &str) -> String {
        format!("models--{}", repo.replace('/', "--"))
    }

    fn repo_dir(&self, repo: &str) -> PathBuf {
        self.root.join(Self::repo_folder(repo))
    }

    /// Where a verified file with this etag lives.
    pub(crate) fn blob(&self, repo: &str, etag: &str) -> PathBuf {
        self.repo_dir(repo).join("blobs").join(etag)
    }

    /// Where its download in progress lives.
    pub(crate) fn incomplete(&self, repo: &str, etag: &str) -> PathBuf {
        self.repo_dir(repo)
            .join("blobs")
            .join(format!("{etag}.incomplete"))
    }

    /// The lock file held while a blob downloads.
    pub(crate) fn lock_file(&self, repo: &str, etag: &str) -> PathBuf {
        self.root
            .join(".locks")
            .join(Self::repo_folder(repo))
            .join(format!("{etag}.lock"))
    }

    pub(crate) fn snapshot(&self, repo: &str, commit: &str) -> PathBuf {
        self.repo_dir(repo).join("snapshots").join(commit)
    }

    /// Links `snapshots/COMMIT/FILE` to the blob (relative, as the Hub's
    /// own client does); returns the link.
    pub(crate) fn link(&self, repo: &str, commit: &str, file: &str, etag: &str) -> Result<PathBuf> {
        let link = self.snapshot(repo, commit).join(file);
        let dir = link.parent().expect("a snapshot file has a folder");
        std::fs::create_dir_all(dir).map_err(|e| HubError::io(dir, e))?;
        let up = "../".repeat(2 + file.matches('/').count());
        let target = PathBuf::from(format!("{up}blobs/{etag}"));
        match std::fs::remove_file(&link) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(HubError::io(&link, e))
            }
            _ => {}
        }
        make_link(&target, &self.blob(repo, etag), &link).map_err(|e| HubError::io(&link, e))?;
        Ok(link)
    }

    /// Records `commit` as the repository's current one.
    pub(crate) fn set_main(&self, repo: &str, commit: &str) -> Result<()> {
        let refs = self.repo_dir(repo).join("refs");
        std::fs::create_dir_all(&refs).map_err(|e| HubError::io(&refs, e))?;
        let main = refs.join("main");
        std::fs::write(&main, commit).map_err(|e| HubError::io(&main, e))
    }

    /// The commit last pulled, if any.
    fn main(&self, repo: &str) -> Option<String> {
        let c = std::fs::read_to_string(self.repo_dir(repo).join("refs/main")).ok()?;
        let c = c.trim();
        crate::client::safe_component(c).then(|| c.to_string())
    }

    /// The complete files of the repository's current snapshot.
    fn files(&self, repo: &str) -> Vec<RepoFile> {
        let Some(commit) = self.main(repo) else {
            return Vec::new();
        };
        let dir = self.snapshot(repo, &commit);
        let mut out = Vec::new();
        walk(&dir, &dir, &mut out);
        out
    }

    pub(crate) fn find_all(&self, repo: &str) -> Vec<CachedModel> {
        let snapshot = self.snapshot(repo, &self.main(repo).unwrap_or_default());
        candidates(&self.files(repo))
            .into_iter()
            .map(|model| CachedModel {
                repo: repo.to_string(),
                path: snapshot.join(&model.first().path),
                snapshot: snapshot.clone(),
                model,
            })
            .collect()
    }

    /// The cached model `spec` names (by the same rules as on the Hub,
    /// among the cached files), None when there is none.
    pub fn find(&self, spec: &ModelSpec) -> Option<CachedModel> {
        let models = self.find_all(&spec.repo);
        let cands: Vec<Candidate> = models.iter().map(|m| m.model.clone()).collect();
        let chosen = choose(&spec.repo, &cands, spec.quant.as_deref()).ok()?;
        models.into_iter().find(|m| &m.model == chosen)
    }

    /// Every cached model, by repository then name.
    pub fn list(&self) -> Result<Vec<CachedModel>> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(HubError::io(&self.root, e)),
        };
        let mut repos: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                Some(name.strip_prefix("models--")?.replace("--", "/"))
            })
            .collect();
        repos.sort();
        Ok(repos.iter().flat_map(|r| self.find_all(r)).collect())
    }

    /// Removes the model `spec` names (without QUANT: the repository's
    /// whole folder, partial downloads included); returns what it removed.
    pub fn remove(&self, spec: &ModelSpec) -> Result<Vec<CachedModel>> {
        let dir = self.repo_dir(&spec.repo);
        let not_cached = || HubError::NotCached {
            spec: spec.to_string(),
            root: self.root.clone(),
        };
        if !dir.exists() {
            return Err(not_cached());
        }
        let models = self.find_all(&spec.repo);
        let removed = match &spec.quant {
            None => models,
            Some(_) => vec![self.find(spec).ok_or_else(not_cached)?],
        };
        if spec.quant.is_some() {
            for (m, f) in removed
                .iter()
                .flat_map(|m| m.model.files.iter().map(move |f| (m, f)))
            {
                let link = m.snapshot.join(&f.path);
                let blob = std::fs::canonicalize(&link).map_err(|e| HubError::io(&link, e))?;
                std::fs::remove_file(&link).map_err(|e| HubError::io(&link, e))?;
                if !self.linked(&spec.repo, &blob) {
                    std::fs::remove_file(&blob).map_err(|e| HubError::io(&blob, e))?;
                }
            }
        }
        if spec.quant.is_none() || self.find_all(&spec.repo).is_empty() {
            std::fs::remove_dir_all(&dir).map_err(|e| HubError::io(&dir, e))?;
            let locks = self.root.join(".locks").join(Self::repo_folder(&spec.repo));
            let _ = std::fs::remove_dir_all(locks);
        }
        Ok(removed)
    }

    /// Whether any snapshot of `repo` still links to `blob`.
    fn linked(&self, repo: &str, blob: &Path) -> bool {
        let snaps = self.repo_dir(repo).join("snapshots");
        let Ok(entries) = std::fs::read_dir(&snaps) else {
            return false;
        };
        entries.filter_map(|e| e.ok()).any(|e| {
            let mut files = Vec::new();
            walk(&e.path(), &e.path(), &mut files);
            files
                .iter()
                .any(|f| std::fs::canonicalize(e.path().join(&f.path)).is_ok_and(|p| p == blob))
        })
    }
}

/// The files under `dir` whose links resolve, as paths relative to `root`.
fn walk(root: &Path, dir: &Path, out: &mut Vec<RepoFile>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.filter_map(|e| e.ok()).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        // Follows the link: a dangling one has no metadata and is skipped.
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            walk(root, &path, out);
        } else if let Ok(rel) = path.strip_prefix(root) {
            let rel: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            out.push(RepoFile {
                path: rel.join("/"),
                size: meta.len(),
            });
        }
    }
}

/// A relative symlink where links exist, else a hard link to the blob.
fn make_link(target: &Path, blob: &Path, link: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let _ = blob;
        std::os::unix::fs::symlink(target, link)
    }
    #[cfg(not(unix))]
    {
        let _ = target;
        std::fs::hard_link(blob, link)
    }
}
