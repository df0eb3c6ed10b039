//! One file into the cache: resumed from `blobs/ETAG.incomplete` with an
//! HTTP range, retried when the connection drops, verified against the
//! LFS sha256, and renamed into place only once whole and verified.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::cache::Cache;
use crate::client::{header, Client, FileMeta};
use crate::error::{HubError, Result};

/// Connection losses survived within one run (each resumes where the last
/// stopped); the partial file also survives the run.
const ATTEMPTS: usize = 5;
const CHUNK: usize = 1 << 20;

/// Told how a download goes (the CLI draws a bar or prints lines).
pub trait Progress {
    /// A file starts (or resumes at `done` of `total` bytes).
    fn start(&mut self, file: &str, total: u64, done: u64);
    fn advance(&mut self, bytes: u64);
    /// Something the user should know (a resume, a restart).
    fn note(&mut self, msg: &str);
    /// The file is complete and verified.
    fn finish(&mut self);
}

/// Progress that shows nothing.
pub struct Quiet;

impl Progress for Quiet {
    fn start(&mut self, _: &str, _: u64, _: u64) {}
    fn advance(&mut self, _: u64) {}
    fn note(&mut self, _: &str) {}
    fn finish(&mut self) {}
}

/// What one download needs to know.
pub(crate) struct Job<'a> {
    pub repo: &'a str,
    /// The repository path, for messages.
    pub file: &'a str,
    pub url: &'a str,
    pub meta: &'a FileMeta,
}

/// Makes sure `blobs/ETAG` holds the whole, verified file; false when it
/// already did.
pub(crate) fn fetch(
    client: &Client,
    cache: &Cache,
    job: &Job,
    progress: &mut dyn Progress,
) -> Result<bool> {
    let blob = cache.blob(job.repo, &job.meta.etag);
    if complete(&blob, job.meta.size) {
        return Ok(false);
    }
    let lock_path = cache.lock_file(job.repo, &job.meta.etag);
    let _lock = lock(&lock_path, job.file, progress)?;
    // Another process may have finished it while we waited.
    if complete(&blob, job.meta.size) {
        return Ok(false);
    }
    let part = cache.incomplete(job.repo, &job.meta.etag);
    let dir = part.parent().expect("blobs folder");
    std::fs::create_dir_all(dir).map_err(|e| HubError::io(dir, e))?;
    let resumed = file_len(&part) > 0;
    match download(client, job, &part, progress) {
        // A resumed file can fail only because of its old bytes: once more
        // from scratch before giving up.
        Err(HubError::Checksum { .. }) if resumed => {
            progress.note(&format!(
                "{}: the partial download was corrupt; downloading it afresh",
                job.file
            ));
            download(client, job, &part, progress)?;
        }
        r => r?,
    }
    std::fs::rename(&part, &blob).map_err(|e| HubError::io(&blob, e))?;
    progress.finish();
    Ok(true)
}

fn complete(blob: &Path, size: u64) -> bool {
    std::fs::metadata(blob).is_ok_and(|m| m.is_file() && m.len() == size)
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

/// Holds the blob's lock file (the Hub's own client locks the same file),
/// waiting for another download of it to end.
fn lock(path: &Path, file: &str, progress: &mut dyn Progress) -> Result<File> {
    let dir = path.parent().expect("locks folder");
    std::fs::create_dir_all(dir).map_err(|e| HubError::io(dir, e))?;
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| HubError::io(path, e))?;
    if f.try_lock().is_err() {
        progress.note(&format!(
            "{file}: another process is downloading it; waiting"
        ));
        f.lock().map_err(|e| HubError::io(path, e))?;
    }
    Ok(f)
}

/// Downloads into `part` (resuming it), then verifies; a mismatch deletes
/// `part`.
fn download(client: &Client, job: &Job, part: &Path, progress: &mut dyn Progress) -> Result<()> {
    let total = job.meta.size;
    let mut done = file_len(part);
    if done > total {
        progress.note(&format!(
            "{}: the partial download is larger than the file (corrupt); starting afresh",
            job.file
        ));
        remove(part)?;
        done = 0;
    }
    let mut hasher = Sha256::new();
    hash_prefix(part, done, &mut hasher)?;
    progress.start(job.file, total, done);
    let mut attempt = 0;
    while done < total {
        attempt += 1;
        match transfer(client, job, part, &mut done, &mut hasher, progress) {
            Ok(()) => {}
            Err(Lost(detail)) if attempt < ATTEMPTS => {
                progress.note(&format!(
                    "{}: connection lost after {done} of {total} bytes ({detail}); resuming",
                    job.file
                ));
            }
            Err(Lost(detail)) => {
                return Err(HubError::Interrupted {
                    file: job.file.to_string(),
                    done,
                    total,
                    detail,
                })
            }
            Err(Fatal(e)) => return Err(e),
        }
    }
    let got = format!("{:x}", hasher.finalize());
    if let Some(expected) = job.meta.sha256() {
        if !got.eq_ignore_ascii_case(expected) {
            remove(part)?;
            return Err(HubError::Checksum {
                file: job.file.to_string(),
                expected: expected.to_string(),
                got,
            });
        }
    }
    Ok(())
}

/// Why one transfer stopped early.
enum Stop {
    /// The connection: worth resuming.
    Lost(String),
    Fatal(HubError),
}
use Stop::{Fatal, Lost};

/// One ranged request from `done` on, appended to `part`.
fn transfer(
    client: &Client,
    job: &Job,
    part: &Path,
    done: &mut u64,
    hasher: &mut Sha256,
    progress: &mut dyn Progress,
) -> Result<(), Stop> {
    let resp = match client.get_from(job.repo, job.url, *done) {
        Ok(r) => r,
        Err(HubError::Network { detail, .. }) => return Err(Lost(detail)),
        Err(e) => return Err(Fatal(e)),
    };
    let status = resp.status().as_u16();
    let start = match status {
        206 => header(&resp, "content-range").and_then(|r| {
            r.strip_prefix("bytes ")?
                .split('-')
                .next()?
                .parse::<u64>()
                .ok()
        }),
        _ => Some(0),
    };
    // 416: our range starts at or past the end; 200: no range support.
    if status == 416 || start == Some(0) && *done > 0 {
        remove(part).map_err(Fatal)?;
        *done = 0;
        *hasher = Sha256::new();
        if status == 416 {
            return Err(Lost("the server refused the resume range".into()));
        }
        progress.start(job.file, job.meta.size, 0);
    } else if start != Some(*done) {
        return Err(Fatal(HubError::BadAnswer {
            url: job.url.to_string(),
            why: format!("asked for bytes from {done}, got Content-Range {start:?}"),
        }));
    }
    let mut out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(part)
        .map_err(|e| Fatal(HubError::io(part, e)))?;
    let mut body = resp.into_body().into_reader();
    let mut buf = vec![0u8; CHUNK];
    let total = job.meta.size;
    while *done < total {
        let want = buf.len().min((total - *done) as usize);
        let n = match body.read(&mut buf[..want]) {
            Ok(0) => return Err(Lost("the connection closed early".into())),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(Lost(e.to_string())),
        };
        out.write_all(&buf[..n]).map_err(|e| {
            Fatal(match e.kind() {
                ErrorKind::StorageFull | ErrorKind::QuotaExceeded => HubError::DiskFull {
                    path: part.to_path_buf(),
                    done: *done,
                    total,
                },
                _ => HubError::io(part, e),
            })
        })?;
        hasher.update(&buf[..n]);
        *done += n as u64;
        progress.advance(n as u64);
    }
    out.sync_all().map_err(|e| Fatal(HubError::io(part, e)))
}

/// Feeds the first `len` bytes of `part` (what an earlier run wrote).
fn hash_prefix(part: &Path, len: u64, hasher: &mut Sha256) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let mut f = File::open(part).map_err(|e| HubError::io(part, e))?;
    let mut buf = vec![0u8; CHUNK];
    let mut left = len;
    while left > 0 {
        let n = f
            .read(&mut buf[..CHUNK.min(left as usize)])
            .map_err(|e| HubError::io(part, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        left -= n as u64;
    }
    Ok(())
}

fn remove(p: &Path) -> Result<()> {
    match std::fs::remove_file(p) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(HubError::io(p, e)),
        _ => Ok(()),
    }
}
