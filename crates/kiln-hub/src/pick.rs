//! Which GGUF model of a repository a QUANT names. A repository holds
//! files; a model is one `.gguf` file or the parts of a split one
//! (`NAME-00001-of-00003.gguf`, ...), and vision projectors (`mmproj*`)
//! and importance matrices are not models.

use crate::HubError;

/// The quant picked when none is given (llama.cpp's and Ollama's default).
pub const DEFAULT_QUANT: &str = "Q4_K_M";

/// A file of a repository (path relative to its root) and its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoFile {
    pub path: String,
    pub size: u64,
}

/// One model: its files (a split model's parts in order) and total size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The path without `.gguf` and without a split suffix.
    pub name: String,
    pub files: Vec<RepoFile>,
    pub size: u64,
}

impl Candidate {
    /// The quant tag its name ends with (`Q4_K_M` of
    /// `gemma-3-1b-it-Q4_K_M`; `UD-Q4_K_XL` keeps its `UD-`).
    pub fn quant(&self) -> &str {
        let base = basename(&self.name);
        let cut = base.rfind(['-', '.']).map_or(0, |i| i + 1);
        let ud = base[..cut.saturating_sub(1)].to_ascii_lowercase();
        if ud.ends_with("ud") && cut >= 3 {
            let start = cut - 3;
            if start == 0 || base[..start].ends_with(['-', '.']) {
                return &base[start..];
            }
        }
        &base[cut..]
    }

    /// The file to open: the first part.
    pub fn first(&self) -> &RepoFile {
        &self.files[0]
    }
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// `(prefix, part number, count)` of a split part's path.
fn split_part(path: &str) -> Option<(&str, u32, u32)> {
    let stem = path.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) {
        return None;
    }
    Some((prefix, no.parse().ok()?, count.parse().ok()?))
}

/// The models among `files`: split parts grouped (a split model missing a
/// part is left out), projectors and imatrix files skipped; sorted by name.
pub fn candidates(files: &[RepoFile]) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::new();
    // (prefix, part count, parts seen with their numbers)
    type Split = (String, u32, Vec<(u32, RepoFile)>);
    let mut splits: Vec<Split> = Vec::new();
    for f in files {
        let base = basename(&f.path).to_ascii_lowercase();
        if !base.ends_with(".gguf") || base.starts_with("mmproj") || base.contains("imatrix") {
            continue;
        }
        match split_part(&f.path) {
            Some((prefix, no, count)) => {
                match splits.iter_mut().find(|s| s.0 == prefix && s.1 == count) {
                    Some(s) => s.2.push((no, f.clone())),
                    None => splits.push((prefix.to_string(), count, vec![(no, f.clone())])),
                }
            }
            None => out.push(Candidate {
                name: f.path.trim_end_matches(".gguf").to_string(),
                files: vec![f.clone()],
                size: f.size,
            }),
        }
    }
    for (name, count, mut parts) in splits {
        parts.sort_by_key(|p| p.0);
        let complete = parts.iter().map(|p| p.0).eq(1..=count);
        if complete {
            let files: Vec<RepoFile> = parts.into_iter().map(|p| p.1).collect();
            let size = files.iter().map(|f| f.size).sum();
            out.push(Candidate { name, files, size });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Whether `quant` names `c`: its file name or path (with or without
/// `.gguf`), or a tag in its name between non-word characters
/// (`q4_k_m` matches `x-Q4_K_M` but `Q4_K` does not).
fn names(c: &Candidate, quant: &str) -> bool {
    let q = quant.to_ascii_lowercase();
    let q = q.strip_suffix(".gguf").unwrap_or(&q);
    let name = c.name.to_ascii_lowercase();
    let first = c.first().path.to_ascii_lowercase();
    let first = first.trim_end_matches(".gguf");
    if [name.as_str(), basename(&name), first, basename(first)].contains(&q) {
        return true;
    }
    let base = basename(&name);
    let word = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_');
    base.match_indices(q).any(|(i, _)| {
        !word(i.checked_sub(1).map(|j| base.as_bytes()[j]))
            && !word(base.as_bytes().get(i + q.len()).copied())
    })
}

/// The model `quant` names among `cands` (None: the Q4_K_M one, else the
/// smallest). Errors list what the repository has.
pub fn choose<'a>(
    repo: &str,
    cands: &'a [Candidate],
    quant: Option<&str>,
) -> Result<&'a Candidate, HubError> {
    if cands.is_empty() {
        return Err(HubError::NoGguf {
            repo: repo.to_string(),
        });
    }
    let matching =
        |q: &str| -> Vec<&'a Candidate> { cands.iter().filter(|c| names(c, q)).collect() };
    let Some(q) = quant else {
        return Ok(match matching(DEFAULT_QUANT).as_slice() {
            [one] => one,
            _ => cands
                .iter()
                .min_by_key(|c| c.size)
                .expect("cands is not empty"),
        });
    };
    let found = matching(q);
    // An exact tag beats a tag inside a longer name (`Q8_0` over `UD-Q8_0`).
    let exact: Vec<&Candidate> = found
        .iter()
        .copied()
        .filter(|c| c.quant().eq_ignore_ascii_case(q))
        .collect();
    match (found.as_slice(), exact.as_slice()) {
        ([one], _) | (_, [one]) => Ok(one),
        ([], _) => Err(HubError::QuantNotFound {
            repo: repo.to_string(),
            quant: q.to_string(),
            available: available(cands),
        }),
        (many, _) => Err(HubError::AmbiguousQuant {
            repo: repo.to_string(),
            quant: q.to_string(),
            files: many.iter().map(|c| c.first().path.clone()).collect(),
        }),
    }
}

/// The repository's quant tags, each once (file names where a tag is
/// shared, so that every entry picks one model).
pub fn available(cands: &[Candidate]) -> Vec<String> {
    cands
        .iter()
        .map(|c| {
            let q = c.quant();
            let shared = cands
                .iter()
                .filter(|d| d.quant().eq_ignore_ascii_case(q))
                .count();
            if shared == 1 {
                q.to_string()
            } else {
                basename(&c.first().path).to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, u64)]) -> Vec<RepoFile> {
        list.iter()
            .map(|&(p, s)| RepoFile {
                path: p.to_string(),
                size: s,
            })
            .collect()
    }

    fn pick(list: &[(&str, u64)], q: Option<&str>) -> Result<String, String> {
        let c = candidates(&files(list));
        choose("o/r", &c, q)
            .map(|c| c.first().path.clone())
            .map_err(|e| e.to_string())
    }

    const REPO: &[(&str, u64)] = &[
        ("README.md", 10),
        ("m-F16.gguf", 500),
        ("m-Q4_K_M.gguf", 150),
        ("m-Q4_K_S.gguf", 140),
        ("m-Q8_0.gguf", 260),
        ("m-IQ2_XXS.gguf", 90),
        ("mmproj-m-F16.gguf", 5),
        ("big/m-BF16-00001-of-00002.gguf", 300),
        ("big/m-BF16-00002-of-00002.gguf", 200),
    ];

    #[test]
    fn quants_case_insensitive_default_q4_k_m() {
        assert_eq!(pick(REPO, None).unwrap(), "m-Q4_K_M.gguf");
        assert_eq!(pick(REPO, Some("q8_0")).unwrap(), "m-Q8_0.gguf");
        assert_eq!(pick(REPO, Some("Q4_K_S")).unwrap(), "m-Q4_K_S.gguf");
        assert_eq!(pick(REPO, Some("f16")).unwrap(), "m-F16.gguf");
        assert_eq!(pick(REPO, Some("m-Q8_0.gguf")).unwrap(), "m-Q8_0.gguf");
        assert_eq!(
            pick(REPO, Some("bf16")).unwrap(),
            "big/m-BF16-00001-of-00002.gguf"
        );
        let c = candidates(&files(REPO));
        let bf16 = choose("o/r", &c, Some("BF16")).unwrap();
        assert_eq!((bf16.files.len(), bf16.size), (2, 500));
    }

    #[test]
    fn without_q4_k_m_the_smallest() {
        let repo: Vec<_> = REPO
            .iter()
            .copied()
            .filter(|f| f.0 != "m-Q4_K_M.gguf")
            .collect();
        assert_eq!(pick(&repo, None).unwrap(), "m-IQ2_XXS.gguf");
    }

    #[test]
    fn a_missing_quant_lists_the_available_ones() {
        let e = pick(REPO, Some("Q4_K")).unwrap_err();
        assert!(e.contains("no Q4_K model in o/r"), "{e}");
        assert!(
            e.contains("available: BF16, F16, IQ2_XXS, Q4_K_M, Q4_K_S, Q8_0"),
            "{e}"
        );
        assert_eq!(
            pick(&REPO[..1], None).unwrap_err(),
            "o/r has no GGUF model files"
        );
    }

    #[test]
    fn incomplete_splits_and_shared_tags() {
        let c = candidates(&files(&[
            ("a-Q8_0-00001-of-00003.gguf", 1),
            ("a-Q8_0-00003-of-00003.gguf", 1),
        ]));
        assert!(c.is_empty());
        let list = [
            ("x-Q8_0.gguf", 1),
            ("y-Q8_0.gguf", 2),
            ("y-UD-Q8_0.gguf", 3),
        ];
        let e = pick(&list, Some("Q8_0")).unwrap_err();
        assert!(
            e.contains("x-Q8_0.gguf, y-Q8_0.gguf, y-UD-Q8_0.gguf"),
            "{e}"
        );
        assert_eq!(pick(&list, Some("ud-q8_0")).unwrap(), "y-UD-Q8_0.gguf");
        let c = candidates(&files(&list));
        assert_eq!(available(&c), ["x-Q8_0.gguf", "y-Q8_0.gguf", "UD-Q8_0"]);
    }
}
