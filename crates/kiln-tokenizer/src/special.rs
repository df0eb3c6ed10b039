//! Splitting raw text at special tokens written in it (llama.cpp's
//! `tokenizer_st_partition`).
//!
//! llama.cpp takes the special tokens longest first and, for each, splits
//! every still-raw fragment at its leftmost non-overlapping occurrences.
//! That is not the same as a leftmost-longest scan ("abcd" with specials
//! "bcd" and "ab" gives `a`,`<bcd>`), so we reproduce it: find every
//! occurrence of every special token with a trie (linear in the text for
//! bounded token length), then accept occurrences in (priority, position)
//! order when they do not touch an accepted one. llama.cpp orders tokens of
//! equal length with an unstable sort; we break ties by id.

use crate::pieces::Vocab;
use crate::vocab::TokenAttr;

pub(crate) enum Fragment<'a> {
    Text(&'a [u8]),
    Token(u32),
}

#[derive(Debug, Default)]
struct Node {
    /// Sorted by byte.
    children: Vec<(u8, u32)>,
    /// (token id, priority, needs parse_special).
    token: Option<(u32, u32, bool)>,
}

#[derive(Debug)]
pub(crate) struct SpecialMatcher {
    nodes: Vec<Node>,
    n_priorities: usize,
}

impl SpecialMatcher {
    pub(crate) fn new(texts: &Vocab, attrs: &[TokenAttr]) -> SpecialMatcher {
        let mask = TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN;
        let text = |id: u32| texts.get(id).unwrap_or_default();
        let mut ids: Vec<u32> = (0..texts.len() as u32)
            .filter(|&i| attrs[i as usize].has(mask))
            .collect();
        ids.sort_by(|&a, &b| text(b).len().cmp(&text(a).len()).then(a.cmp(&b)));
        let mut nodes = vec![Node::default()];
        for (prio, &id) in ids.iter().enumerate() {
            let mut cur = 0usize;
            for &b in text(id) {
                let pos = nodes[cur].children.binary_search_by_key(&b, |c| c.0);
                cur = match pos {
                    Ok(p) => nodes[cur].children[p].1 as usize,
                    Err(p) => {
                        let next = nodes.len();
                        nodes.push(Node::default());
                        nodes[cur].children.insert(p, (b, next as u32));
                        next
                    }
                };
            }
            // Token texts are unique, so each end node is claimed once.
            // CONTROL wins over USER_DEFINED when both are set.
            let only_parse_special =
                attrs[id as usize].has(TokenAttr::CONTROL | TokenAttr::UNKNOWN);
            nodes[cur].token = Some((id, prio as u32, only_parse_special));
        }
        SpecialMatcher {
            nodes,
            n_priorities: ids.len(),
        }
    }

    pub(crate) fn partition<'a>(&self, text: &'a [u8], parse_special: bool) -> Vec<Fragment<'a>> {
        // (priority, start, len, id) of every occurrence.
        let mut occ: Vec<(u32, u32, u32, u32)> = Vec::new();
        if self.n_priorities > 0 {
            for start in 0..text.len() {
                let mut cur = 0usize;
                for (k, &b) in text[start..].iter().enumerate() {
                    let node = &self.nodes[cur];
                    match node.children.binary_search_by_key(&b, |c| c.0) {
                        Ok(p) => cur = node.children[p].1 as usize,
                        Err(_) => break,
                    }
                    if let Some((id, prio, only_special)) = self.nodes[cur].token {
                        if parse_special || !only_special {
                            occ.push((prio, start as u32, k as u32 + 1, id));
                        }
                    }
                }
            }
        }
        if occ.is_empty() {
            return if text.is_empty() {
                Vec::new()
            } else {
                vec![Fragment::Text(text)]
            };
        }
        occ.sort_unstable();

        // Accepted occurrences never overlap, and every one accepted before
        // the current candidate is at least as long, so an overlap always
        // covers the candidate's first or last byte.
        let mut claimed = vec![false; text.len()];
        let mut accepted: Vec<(u32, u32, u32)> = Vec::new();
        for &(_, start, len, id) in &occ {
            let (s, e) = (start as usize, (start + len) as usize);
            if claimed[s] || claimed[e - 1] {
                continue;
            }
            claimed[s..e].iter_mut().for_each(|c| *c = true);
            accepted.push((start, len, id));
        }
        accepted.sort_unstable();

        let mut out = Vec::with_capacity(accepted.len() * 2 + 1);
        let mut pos = 0usize;
        for (start, len, id) in accepted {
            let s = start as usize;
            if s > pos {
                out.push(Fragment::Text(&text[pos..s]));
            }
            out.push(Fragment::Token(id));
            pos = s + len as usize;
        }
        if pos < text.len() {
            out.push(Fragment::Text(&text[pos..]));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(specials: &[(&str, u32)], text: &str, parse_special: bool) -> Vec<String> {
        let texts = Vocab::new(specials.iter().map(|s| s.0).collect()).unwrap();
        let attrs: Vec<TokenAttr> = specials.iter().map(|s| TokenAttr(s.1)).collect();
        SpecialMatcher::new(&texts, &attrs)
            .partition(text.as_bytes(), parse_special)
            .into_iter()
            .map(|f| match f {
                Fragment::Text(t) => String::from_utf8(t.to_vec()).unwrap(),
                Fragment::Token(id) => format!("#{id}"),
            })
            .collect()
    }

    const C: u32 = TokenAttr::CONTROL;
    const U: u32 = TokenAttr::USER_DEFINED;

    #[test]
    fn longest_token_first_not_leftmost() {
        // llama.cpp takes "bcd" before "ab" although "ab" starts earlier.
        assert_eq!(split(&[("ab", C), ("bcd", C)], "abcd", true), ["a", "#1"]);
        assert_eq!(
            split(&[("ab", C), ("bcd", C)], "abxbcd", true),
            ["#0", "x", "#1"]
        );
    }

    #[test]
    fn control_needs_parse_special_user_defined_does_not() {
        assert_eq!(
            split(&[("<c>", C), ("<u>", U)], "<c><u>", false),
            ["<c>", "#1"]
        );
        assert_eq!(
            split(&[("<c>", C), ("<u>", U)], "<c><u>", true),
            ["#0", "#1"]
        );
        // Both bits: CONTROL wins (Gemma 3 "</s>").
        assert_eq!(split(&[("</s>", C | U)], "</s>", false), ["</s>"]);
    }

    #[test]
    fn repeated_and_overlapping_occurrences() {
        assert_eq!(split(&[("aa", U)], "aaaaa", true), ["#0", "#0", "a"]);
        assert_eq!(split(&[("aa", U)], "", true), Vec::<String>::new());
    }
}
