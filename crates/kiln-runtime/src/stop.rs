//! Stop-string matching on streamed text.
//!
//! Text arrives one token piece at a time, and a stop string may straddle
//! pieces. [`StopMatcher`] therefore holds back the longest tail of the text
//! that could still grow into a stop string, and releases it once it cannot.
//! The stop string itself is never emitted (OpenAI semantics).

/// What [`StopMatcher::push`] decided for the text seen so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopStatus {
    /// No stop string yet: `emit` is safe to show; some text may be held.
    Continue {
        /// Text that can no longer be part of a stop string.
        emit: String,
    },
    /// A stop string matched: `emit` is the text before it; generation ends.
    Stopped {
        /// Text before the stop string.
        emit: String,
        /// Index into the stop list of the string that matched.
        stop_index: usize,
    },
}

/// Finds stop strings in streamed text, holding back possible prefixes.
///
/// ```
/// use kiln_runtime::{StopMatcher, StopStatus};
/// let mut m = StopMatcher::new(vec!["<END>".to_string()]);
/// assert_eq!(m.push("Hello <E"), StopStatus::Continue { emit: "Hello ".into() });
/// assert_eq!(m.push("ND> tail"), StopStatus::Stopped { emit: "".into(), stop_index: 0 });
///
/// let mut m = StopMatcher::new(vec!["<END>".to_string()]);
/// assert_eq!(m.push("a <"), StopStatus::Continue { emit: "a ".into() });
/// assert_eq!(m.push("b"), StopStatus::Continue { emit: "<b".into() });
/// assert_eq!(m.push("<"), StopStatus::Continue { emit: "".into() });
/// assert_eq!(m.finish(), "<"); // end of stream: release what was held
/// ```
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet emitted (a possible stop-string prefix).
    held: String,
}

impl StopMatcher {
    /// A matcher for `stops`; empty strings are ignored (they would match
    /// everywhere).
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// True when there is nothing to match (every push emits everything).
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Adds the next piece of generated text.
    pub fn push(&mut self, piece: &str) -> StopStatus {
        if self.stops.is_empty() {
            return StopStatus::Continue {
                emit: piece.to_string(),
            };
        }
        self.held.push_str(piece);
        // Earliest match wins; at one position, the first listed stop.
        let found = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| self.held.find(s.as_str()).map(|pos| (pos, i)))
            .min();
        if let Some((pos, stop_index)) = found {
            let emit = self.held[..pos].to_string();
            self.held.clear();
            return StopStatus::Stopped { emit, stop_index };
        }
        let keep_from = self.partial_match_start();
        let emit = self.held[..keep_from].to_string();
        self.held.drain(..keep_from);
        StopStatus::Continue { emit }
    }

    /// Ends the stream and returns the held text (no stop string matched).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Byte offset where the longest suffix of `held` that is a proper prefix
    /// of some stop string starts (`held.len()` when there is none).
    fn partial_match_start(&self) -> usize {
        let h = self.held.as_bytes();
        let longest = self.stops.iter().map(|s| s.len() - 1).max().unwrap_or(0);
        let first = h.len().saturating_sub(longest);
        (first..h.len())
            .filter(|&i| self.held.is_char_boundary(i))
            .find(|&i| {
                let tail = &h[i..];
                self.stops
                    .iter()
                    .any(|s| s.len() > tail.len() && s.as_bytes().starts_with(tail))
            })
            .unwrap_or(h.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(stops: &[&str], pieces: &[&str]) -> (String, Option<usize>) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            match m.push(p) {
                StopStatus::Continue { emit } => out.push_str(&emit),
                StopStatus::Stopped { emit, stop_index } => {
                    out.push_str(&emit);
                    return (out, Some(stop_index));
                }
            }
        }
        out.push_str(&m.finish());
        (out, None)
    }

    #[test]
    fn stop_split_across_many_pieces() {
        assert_eq!(
            feed(&["STOP"], &["ab", "S", "T", "O", "P", "cd"]),
            ("ab".into(), Some(0))
        );
    }

    #[test]
    fn false_prefix_is_released() {
        assert_eq!(
            feed(&["STOP"], &["ab", "ST", "OX", "y"]),
            ("abSTOXy".into(), None)
        );
    }

    #[test]
    fn earliest_of_several_stops() {
        assert_eq!(
            feed(&["world", "lo w"], &["hello world"]),
            ("hel".into(), Some(1))
        );
        assert_eq!(
            feed(&["\n\n", "User:"], &["x\nUser:", "\n\n"]),
            ("x\n".into(), Some(1))
        );
    }

    #[test]
    fn multibyte_text_and_stops() {
        // "é" is 2 bytes; the held tail must start on a char boundary.
        assert_eq!(feed(&["éa"], &["caf", "é", "!"]), ("café!".into(), None));
        assert_eq!(feed(&["éa"], &["caf", "é", "a"]), ("caf".into(), Some(0)));
        assert_eq!(feed(&["日本"], &["今日", "本"]), ("今".into(), Some(0)));
    }

    #[test]
    fn no_stops_passes_through() {
        let mut m = StopMatcher::new(vec![String::new()]);
        assert!(m.is_empty());
        assert_eq!(m.push("abc"), StopStatus::Continue { emit: "abc".into() });
    }
}
