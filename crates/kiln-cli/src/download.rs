//! Download progress on stderr: an indicatif bar (bytes, rate, ETA) on a
//! terminal, else a plain line at the start, every [`PLAIN_EVERY`] and at
//! the end, so that logs stay readable.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{HumanBytes, HumanDuration, ProgressBar, ProgressStyle};

const PLAIN_EVERY: Duration = Duration::from_secs(10);

/// Shows one file's download at a time.
pub struct DownloadProgress {
    tty: bool,
    bar: Option<ProgressBar>,
    file: String,
    total: u64,
    done: u64,
    /// Bytes and time at the start of this run's transfer (for the rate).
    base: (u64, Instant),
    last_line: Instant,
}

impl DownloadProgress {
    pub fn new() -> DownloadProgress {
        DownloadProgress {
            tty: std::io::stderr().is_terminal(),
            bar: None,
            file: String::new(),
            total: 0,
            done: 0,
            base: (0, Instant::now()),
            last_line: Instant::now(),
        }
    }

    /// `N%` of `total`, rate and ETA since the transfer started.
    fn status(&self) -> String {
        let secs = self.base.1.elapsed().as_secs_f64();
        let rate = (self.done - self.base.0) as f64 / secs.max(1e-3);
        let eta = match rate > 0.0 {
            true => HumanDuration(Duration::from_secs_f64(
                (self.total - self.done) as f64 / rate,
            ))
            .to_string(),
            false => "?".into(),
        };
        format!(
            "{}% ({} of {}, {}/s, ETA {eta})",
            self.done * 100 / self.total.max(1),
            HumanBytes(self.done),
            HumanBytes(self.total),
            HumanBytes(rate as u64)
        )
    }
}

impl kiln_hub::Progress for DownloadProgress {
    fn start(&mut self, file: &str, total: u64, done: u64) {
        self.file = file.to_string();
        (self.total, self.done) = (total, done);
        self.base = (done, Instant::now());
        self.last_line = Instant::now();
        if !self.tty {
            let from = match done {
                0 => String::new(),
                d => format!(", resuming at {}", HumanBytes(d)),
            };
            eprintln!("kiln: downloading {file} ({}{from})", HumanBytes(total));
            return;
        }
        let bar = self.bar.get_or_insert_with(|| ProgressBar::new(total));
        if let Ok(style) = ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(file.to_string());
        bar.set_length(total);
        bar.set_position(done);
        bar.reset_eta();
    }

    fn advance(&mut self, bytes: u64) {
        self.done += bytes;
        match &self.bar {
            Some(bar) => bar.inc(bytes),
            None if self.last_line.elapsed() >= PLAIN_EVERY => {
                self.last_line = Instant::now();
                eprintln!("kiln: {}: {}", self.file, self.status());
            }
            None => {}
        }
    }

    fn note(&mut self, msg: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| eprintln!("kiln: {msg}")),
            None => eprintln!("kiln: {msg}"),
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        eprintln!("kiln: {}: done ({})", self.file, HumanBytes(self.total));
    }
}
