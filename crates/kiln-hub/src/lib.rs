//! GGUF models from the Hugging Face Hub, the way `llama-server -hf` and
//! `ollama pull` get them: `REPO[:QUANT]` ([`ModelSpec`]) picks one model
//! of a repository ([`pick`]), its files download with resume and sha256
//! verification ([`download`]) into a cache in the Hub's own layout
//! ([`Cache`]), and the next run needs no network.
//!
//! Environment: `HF_ENDPOINT` (the Hub's address, default
//! `https://huggingface.co`), `HF_TOKEN` (sent to that host only),
//! `HF_HUB_OFFLINE=1` (cache only), `HF_HUB_CACHE` / `KILN_CACHE_DIR`
//! (where the cache is, see [`Cache::from_env`]).

mod cache;
mod client;
pub mod download;
mod error;
pub mod pick;
mod spec;

pub use cache::{Cache, CachedModel};
pub use download::{Progress, Quiet};
pub use error::{HubError, Result};
pub use spec::ModelSpec;

use client::Client;
use download::Job;
use pick::{candidates, choose};

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The Hub and the cache.
pub struct Hub {
    client: Client,
    cache: Cache,
    offline: bool,
}

impl Hub {
    pub fn new(endpoint: &str, token: Option<String>, cache: Cache) -> Hub {
        Hub {
            client: Client::new(endpoint, token),
            cache,
            offline: false,
        }
    }

    /// The Hub and cache the environment names (see the crate doc).
    pub fn from_env() -> Hub {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.into());
        let mut hub = Hub::new(
            &endpoint,
            var("HF_TOKEN").map(|t| t.trim().to_string()),
            Cache::from_env(),
        );
        hub.offline = var("HF_HUB_OFFLINE").is_some_and(|v| !matches!(v.as_str(), "0" | "false"));
        hub
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The model `spec` names: from the cache when it is there (no
    /// network), else pulled.
    pub fn get(&self, spec: &ModelSpec, progress: &mut dyn Progress) -> Result<CachedModel> {
        match self.cache.find(spec) {
            Some(m) => Ok(m),
            None => self.pull(spec, progress),
        }
    }

    /// Asks the Hub for the repository's current files and downloads what
    /// the cache lacks of the model `spec` names.
    pub fn pull(&self, spec: &ModelSpec, progress: &mut dyn Progress) -> Result<CachedModel> {
        if self.offline {
            return self.cache.find(spec).ok_or_else(|| HubError::Offline {
                spec: spec.to_string(),
                root: self.cache.root().to_path_buf(),
            });
        }
        let repo = &spec.repo;
        let listing = self.client.listing(repo)?;
        let cands = candidates(&listing.files);
        let model = choose(repo, &cands, spec.quant.as_deref())?.clone();
        self.carry_forward(repo, &listing);
        let mut first = None;
        for f in &model.files {
            let url = self.client.file_url(repo, &listing.commit, &f.path);
            let meta = self.client.file_meta(repo, &url)?;
            let job = Job {
                repo,
                file: &f.path,
                url: &url,
                meta: &meta,
            };
            if !download::fetch(&self.client, &self.cache, &job, progress)? {
                progress.note(&format!("{}: already in the cache", f.path));
            }
            let link = self
                .cache
                .link(repo, &listing.commit, &f.path, &meta.etag)?;
            first.get_or_insert(link);
        }
        self.cache.set_main(repo, &listing.commit)?;
        let path = first.expect("a model has a file");
        Ok(CachedModel {
            repo: repo.clone(),
            snapshot: self.cache.snapshot(repo, &listing.commit),
            path,
            model,
        })
    }

    /// Links the models cached at the previous commit into the new one
    /// where the listing says their bytes are unchanged (same LFS sha256),
    /// so a pull at a new commit keeps them visible.
    fn carry_forward(&self, repo: &str, listing: &client::Listing) {
        for m in self.cache.find_all(repo) {
            for f in &m.model.files {
                let blob = std::fs::canonicalize(m.snapshot.join(&f.path)).ok();
                let name = blob.as_ref().and_then(|b| b.file_name()?.to_str());
                let same = listing.lfs.iter().find(|(p, _)| p == &f.path);
                if let (Some(name), Some((_, sha))) = (name, same) {
                    if name == sha {
                        let _ = self.cache.link(repo, &listing.commit, &f.path, sha);
                    }
                }
            }
        }
    }

    /// The Hub's address.
    pub fn endpoint(&self) -> &str {
        self.client.endpoint()
    }
}
