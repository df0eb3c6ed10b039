//! A step's attention and K/V stores over all its sequences at once
//! (`Backend::attention_batch`, `Backend::store_kv_batch`: one launch
//! each on CUDA, each sequence's cache read from the step's KV table)
//! against the CPU backend, which runs the same per sequence: several
//! sequence counts, ragged cache lengths, global caches and sliding
//! rings (short of their window, wrapped, and wrapped many times), Gemma
//! 2's softcap, padding rows with no cache, and prefill chunks (one
//! sequence at a time on CUDA too). Needs a GPU, else one skip line.

mod common;

use common::*;
use kiln_model::{AttnParams, Backend, KvBinding, KvDst, KvStore, PastKv, StepInput};

/// One sequence of a case: `n` new rows after `p0` cached positions in a
/// cache of `rows` rows (`bound`: false for a padding row, which has no
/// cache).
#[derive(Clone, Copy, Debug)]
struct Seq {
    p0: usize,
    n: usize,
    rows: usize,
    bound: bool,
}

#[derive(Clone, Debug)]
struct Case {
    hd: usize,
    n_head: usize,
    n_kv: usize,
    window: Option<usize>,
    softcap: Option<f32>,
    seqs: Vec<Seq>,
}

/// The layer the caches are bound to (not 0: the table's layer offset).
const LAYER: usize = 3;

/// Attention output of every row, then each bound sequence's cache (K,
/// V) after the store.
fn run<B: Backend>(b: &B, c: &Case, data: &[Vec<f32>]) -> (Vec<f32>, Vec<Vec<f32>>) {
    let mut input = StepInput::default();
    for sq in &c.seqs {
        input.push_seq(&vec![0; sq.n], sq.p0);
    }
    let rows = input.rows();
    let [q, k, v] = [&data[0], &data[1], &data[2]].map(|d| b.upload(d).unwrap());
    let mut caches: Vec<(B::Buf, B::Buf)> = c
        .seqs
        .iter()
        .enumerate()
        .map(|(i, _)| {
            (
                b.upload(&data[3 + 2 * i]).unwrap(),
                b.upload(&data[4 + 2 * i]).unwrap(),
            )
        })
        .collect();
    let mut step = b.new_step(rows).unwrap();
    for (i, (sq, (ck, cv))) in c.seqs.iter().zip(&caches).enumerate() {
        for layer in 0..=LAYER {
            let kv = (sq.bound && layer == LAYER).then_some(KvBinding {
                k: ck,
                v: cv,
                rows: sq.rows,
            });
            b.bind_kv(&mut step, i, layer, kv).unwrap();
        }
    }
    b.load_step(&input, &mut step).unwrap();
    let mut out = b.upload(&vec![f32::NAN; rows * c.n_head * c.hd]).unwrap();
    let mut pasts = c.seqs.iter().zip(&caches).map(|(sq, (ck, cv))| {
        (sq.bound && sq.p0 > 0).then_some(PastKv {
            k: ck,
            v: cv,
            start: sq.p0.saturating_sub(sq.rows),
            rows: sq.rows,
        })
    });
    let params: Vec<AttnParams> = input
        .seqs
        .iter()
        .enumerate()
        .map(|(i, sp)| AttnParams {
            n_tok: sp.n_rows,
            p0: sp.p0,
            row0: sp.row0,
            seq: i,
            n_head: c.n_head,
            n_kv_head: c.n_kv,
            head_dim: c.hd,
            scale: 1.0 / (c.hd as f32).sqrt(),
            softcap: c.softcap,
            window: c.window,
        })
        .collect();
    b.attention_batch(LAYER, &q, &k, &v, &mut pasts, &params, &step, &mut out)
        .unwrap();
    drop(pasts);
    let mut stores = c
        .seqs
        .iter()
        .zip(&input.seqs)
        .zip(caches.iter_mut())
        .enumerate()
        .filter(|(_, ((sq, _), _))| sq.bound)
        .map(|(i, ((sq, sp), (ck, cv)))| {
            Ok(KvStore::<'_, B> {
                dst: KvDst {
                    k: ck,
                    v: cv,
                    rows: sq.rows,
                    row_len: c.n_kv * c.hd,
                    ring: c.window.is_some(),
                },
                src_row0: sp.row0,
                n: sp.n_rows,
                p0: sp.p0,
                seq: i,
            })
        });
    b.store_kv_batch(LAYER, &k, &v, &mut stores, &step).unwrap();
    drop(stores);
    let kv = caches
        .iter()
        .flat_map(|(ck, cv)| [read(b, ck), read(b, cv)])
        .collect();
    (read(b, &out), kv)
}

/// Sequences at ragged positions: (p0, n). Global caches hold every
/// position (plus slack); rings of `window` rows hold the last ones (fewer
/// rows while short of the window, as `KvCache` reserves them).
fn seqs(at: &[(usize, usize)], window: Option<usize>, padding: usize) -> Vec<Seq> {
    let mut v: Vec<Seq> = at
        .iter()
        .map(|&(p0, n)| Seq {
            p0,
            n,
            rows: match window {
                Some(w) => (p0 + n).min(w),
                None => p0 + n + 5,
            },
            bound: true,
        })
        .collect();
    v.extend((0..padding).map(|_| Seq {
        p0: 0,
        n: 1,
        rows: 0,
        bound: false,
    }));
    v
}

#[test]
fn batched_attention_and_store_match_cpu() {
    let Some(c) = backend() else { return };
    let mut r = Rng(11);
    let decode = [
        (37, 1),
        (0, 1),
        (1, 1),
        (300, 1),
        (1500, 1),
        (9, 1),
        (64, 1),
    ];
    let ring_decode = [(3, 1), (15, 1), (16, 1), (40, 1), (700, 1), (0, 1)];
    let mut cases = Vec::new();
    for (hd, n_head, n_kv) in [(256, 4, 1), (64, 8, 1), (128, 8, 4), (512, 8, 1)] {
        let base = Case {
            hd,
            n_head,
            n_kv,
            window: None,
            softcap: None,
            seqs: Vec::new(),
        };
        cases.extend([
            // One sequence (a batch-1 decode step).
            Case {
                seqs: seqs(&[(21, 1)], None, 0),
                ..base.clone()
            },
            // Ragged global caches, padded to 8 rows.
            Case {
                seqs: seqs(&decode, None, 1),
                ..base.clone()
            },
            // Sliding rings of 16 (short, full, wrapped) with a softcap.
            Case {
                window: Some(16),
                softcap: Some(50.0),
                seqs: seqs(&ring_decode, Some(16), 2),
                ..base.clone()
            },
            // A prefill chunk beside decode rows (per sequence on CUDA),
            // a ring written past its window by one chunk.
            Case {
                window: Some(16),
                seqs: seqs(&[(5, 1), (20, 7), (0, 40), (33, 1)], Some(16), 0),
                ..base.clone()
            },
            Case {
                seqs: seqs(&[(5, 1), (20, 7), (0, 9)], None, 0),
                ..base.clone()
            },
        ]);
    }
    // 64 sequences (the serving batch), ragged, rings wrapped.
    let many: Vec<(usize, usize)> = (0..61).map(|i| ((i * 37) % 200, 1)).collect();
    cases.push(Case {
        hd: 256,
        n_head: 4,
        n_kv: 1,
        window: Some(32),
        softcap: None,
        seqs: seqs(&many, Some(32), 3),
    });
    for case in cases {
        let rows: usize = case.seqs.iter().map(|s| s.n).sum();
        let (qd, kvd) = (case.n_head * case.hd, case.n_kv * case.hd);
        let mut data = vec![
            r.floats(rows * qd, 2.0),
            r.floats(rows * kvd, 2.0),
            r.floats(rows * kvd, 2.0),
        ];
        for sq in &case.seqs {
            data.push(r.floats(sq.rows * kvd, 2.0));
            data.push(r.floats(sq.rows * kvd, 2.0));
        }
        let (got, got_kv) = run(&c, &case, &data);
        let (want, want_kv) = run(&cpu(), &case, &data);
        let what = format!(
            "hd {} heads {}/{} window {:?} softcap {:?}, {} sequences",
            case.hd,
            case.n_head,
            case.n_kv,
            case.window,
            case.softcap,
            case.seqs.len()
        );
        assert_close(&what, &got, &want, 2e-5);
        assert!(got_kv == want_kv, "{what}: caches after the store differ");
    }
}
