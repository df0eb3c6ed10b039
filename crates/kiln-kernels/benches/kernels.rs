//! `cargo bench -p kiln-kernels [-- FILTER]`: GEMV GB/s (weight bytes
//! streamed), GEMM GFLOP/s, and pool vs rayon fork/join, per ISA, each
//! single-threaded unless stated. Times are the best batch of several (the
//! machine is shared), and the scalar path runs in the same process as the
//! baseline, so compare the ratios. `KILN_BENCH_CPU=1` times by the
//! thread's CPU clock instead (loaded machine, single-threaded benches).

use std::hint::black_box;
use std::time::{Duration, Instant};

use kiln_kernels::{
    argmax_rows, gemm, gemv, gemv_q, gemv_q_tiles, has_gemv_q, pool::Pool, screen_coarse_rows,
    screen_rows, screen_rows_multi, screen_tiles_multi, CoarseRows, Isa, QTiles, QuantX,
    ScreenTiles, ScreenX,
};
use kiln_quant::GgmlType;

/// Seconds of this thread's CPU time (`KILN_BENCH_CPU=1`: on a loaded
/// machine the wall clock also counts the time other processes held the
/// core), else of the wall clock, from an arbitrary start.
fn now() -> f64 {
    static CPU: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *CPU.get_or_init(|| std::env::var_os("KILN_BENCH_CPU").is_some_and(|v| v == "1")) {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec for the call to fill.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        return ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
    }
    static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    T0.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// Best seconds per call over batches of about 40 ms, within `budget`.
fn time(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let t = now();
    f();
    let one = (now() - t).max(1e-9);
    let per_batch = ((0.04 / one) as usize).max(1);
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut batches = 0;
    while batches < 3 || start.elapsed() < budget {
        let t = now();
        for _ in 0..per_batch {
            f();
        }
        best = best.min((now() - t) / per_batch as f64);
        batches += 1;
        if batches >= 40 {
            break;
        }
    }
    best
}

struct Rng(u64);
impl Rng {
    fn f(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn weights(ty: GgmlType, rows: usize, k: usize) -> Vec<u8> {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let packed = k / ty.block_elems() * ty.block_bytes();
    let mut w = vec![0u8; rows * packed];
    let mut v = vec![0.0f32; k];
    for row in w.chunks_mut(packed) {
        v.iter_mut().for_each(|x| *x = rng.f());
        kiln_quant::quantize(ty, &v, row).unwrap();
    }
    w
}

fn acts(len: usize) -> Vec<f32> {
    let mut rng = Rng(99);
    (0..len).map(|_| rng.f()).collect()
}

fn isas() -> Vec<Isa> {
    // Avx512Vnni runs the Avx512 f32 kernels; benchmark it once.
    Isa::available().filter(|&i| i != Isa::Avx512Vnni).collect()
}

/// The levels the screens have SIMD forms for: every available one but
/// the scalar path, `Avx512Vnni` included (its forms differ).
fn screen_isas() -> Vec<Isa> {
    Isa::available().filter(|&i| i != Isa::Scalar).collect()
}

fn bench_gemv(name: &str, ty: GgmlType, rows: usize, k: usize) {
    let w = weights(ty, rows, k);
    let x = acts(k);
    let mut y = vec![0.0f32; rows];
    let packed = w.len() / rows;
    let mut base = 0.0;
    for isa in isas() {
        let budget = Duration::from_millis(if isa == Isa::Scalar { 300 } else { 600 });
        let s = time(budget, || {
            gemv(isa, ty, &w, packed, k, black_box(&x), &mut y).unwrap();
        });
        let gbs = w.len() as f64 / s / 1e9;
        if isa == Isa::Scalar {
            base = s;
        }
        println!(
            "gemv {name:<22} {ty:<5} {rows:>6}x{k:<5} {isa:<7} {:>9.1} us {gbs:>6.2} GB/s  x{:.1} vs scalar",
            s * 1e6,
            base / s
        );
    }
    // The integer kernels (decode's default for packed types), VNNI too.
    let mut qx = QuantX::new();
    qx.set(&x);
    for isa in Isa::available().filter(|&i| has_gemv_q(i, ty)) {
        let s = time(Duration::from_millis(600), || {
            gemv_q(isa, ty, &w, packed, black_box(&qx), &mut y).unwrap();
        });
        let gbs = w.len() as f64 / s / 1e9;
        println!(
            "gemv_q {name:<20} {ty:<5} {rows:>6}x{k:<5} {isa:<7} {:>9.1} us {gbs:>6.2} GB/s  x{:.1} vs scalar",
            s * 1e6,
            base / s
        );
    }
}

/// The integer GEMV of `n` activation rows: the row form once per row
/// against the tiled form (Q5_0, AVX-512 VNNI), one thread.
fn bench_gemv_tiles(ty: GgmlType, rows: usize, k: usize, n: usize) {
    let w = weights(ty, rows, k);
    let packed = w.len() / rows;
    let qxs: Vec<QuantX> = (0..n)
        .map(|i| {
            let mut q = QuantX::new();
            q.set(&acts(k + i)[i..]);
            q
        })
        .collect();
    let mut y = vec![0.0f32; rows * n];
    for isa in Isa::available().filter(|&i| i >= Isa::Avx512Vnni) {
        let t0 = Instant::now();
        let Some(tiles) = QTiles::pack(isa, ty, &w, packed, rows, k, None) else {
            continue;
        };
        let pack_ms = t0.elapsed().as_secs_f64() * 1e3;
        let rs = time(Duration::from_millis(600), || {
            for (q, yt) in qxs.iter().zip(y.chunks_exact_mut(rows)) {
                gemv_q(isa, ty, &w, packed, black_box(q), yt).unwrap();
            }
        });
        let want = y.clone();
        let ts = time(Duration::from_millis(600), || {
            gemv_q_tiles(isa, &tiles, 0, rows, black_box(&qxs), &mut y, rows).unwrap();
        });
        let err = want
            .iter()
            .zip(&y)
            .map(|(a, b)| ((a - b) / (1.0 + a.abs())).abs())
            .fold(0.0f32, f32::max);
        println!(
            "gemv_q {ty} {rows}x{k} n={n} {isa:<10} rows {:>9.1} us, tiles {:>9.1} us ({:.2}x; {:.2} / {:.2} GB/s; max rel diff {err:.1e}; packed in {pack_ms:.2} ms)",
            rs * 1e6,
            ts * 1e6,
            rs / ts,
            w.len() as f64 / rs * n as f64 / 1e9,
            w.len() as f64 / ts / 1e9,
        );
    }
}

fn bench_argmax(rows: usize, k: usize) {
    let ty = GgmlType::Q8_0;
    let w = weights(ty, rows, k);
    let x = acts(k);
    let packed = w.len() / rows;
    let mut y = vec![0.0f32; rows];
    for isa in isas().into_iter().filter(|&i| i != Isa::Scalar) {
        let budget = Duration::from_millis(600);
        let a = time(budget, || {
            black_box(argmax_rows(isa, ty, &w, packed, k, black_box(&x), 0).unwrap());
        });
        let g = time(budget, || {
            gemv(isa, ty, &w, packed, k, black_box(&x), &mut y).unwrap();
        });
        println!(
            "argmax lm_head Q8_0 {rows}x{k} {isa:<7} {:>8.1} us ({:.2} GB/s), gemv {:.1} us",
            a * 1e6,
            w.len() as f64 / a / 1e9,
            g * 1e6
        );
    }
}

/// The greedy head's int8 screen over the whole tied embedding.
fn bench_screen(rows: usize, k: usize) {
    let ty = GgmlType::Q8_0;
    let w = weights(ty, rows, k);
    let x = acts(k);
    let sx = ScreenX::new(&x).expect("finite x");
    let packed = w.len() / rows;
    let mut hi = vec![0.0f32; rows];
    for isa in screen_isas() {
        let s = time(Duration::from_millis(600), || {
            black_box(screen_rows(isa, ty, &w, packed, black_box(&sx), &mut hi).unwrap());
        });
        println!(
            "screen lm_head Q8_0 {rows}x{k} {isa:<10} {:>8.1} us ({:.2} GB/s)",
            s * 1e6,
            w.len() as f64 / s / 1e9
        );
    }
    let coarse = CoarseRows::pack(ty, &w, packed, rows, k, None, &|_| {}).expect("Q8_0 rows");
    let read = coarse.bytes() / 34 * 26;
    for isa in screen_isas() {
        let s = time(Duration::from_millis(600), || {
            black_box(screen_coarse_rows(isa, &coarse, 0, black_box(&sx), &mut hi).unwrap());
        });
        println!(
            "screen lm_head coarse {rows}x{k} {isa:<10} {:>8.1} us ({:.2} GB/s of its {:.1} MB)",
            s * 1e6,
            read as f64 / s / 1e9,
            read as f64 / 1e6
        );
    }
}

/// The screen of a batch's greedy head: `n` activation rows at once.
fn bench_screen_multi(rows: usize, k: usize, n: usize) {
    let ty = GgmlType::Q8_0;
    let w = weights(ty, rows, k);
    let sxs: Vec<ScreenX> = (0..n)
        .map(|i| ScreenX::new(&acts(k + i)[i..]).expect("finite x"))
        .collect();
    let packed = w.len() / rows;
    let (mut hi, mut lo) = (vec![0.0f32; rows * n], vec![0.0f32; n]);
    for isa in screen_isas() {
        let s = time(Duration::from_millis(600), || {
            lo.fill(f32::NEG_INFINITY);
            screen_rows_multi(isa, ty, &w, packed, black_box(&sxs), &mut hi, &mut lo).unwrap();
            black_box(&hi);
        });
        println!(
            "screen lm_head Q8_0 {rows}x{k} n={n} {isa:<10} {:>8.1} us ({:.2} GB/s)",
            s * 1e6,
            w.len() as f64 / s / 1e9
        );
        // The same rows from packed tiles (levels that pack them).
        let Some(tiles) = ScreenTiles::pack(isa, ty, &w, packed, rows, k) else {
            continue;
        };
        let held = tiles.rows();
        let s = time(Duration::from_millis(600), || {
            lo.fill(f32::NEG_INFINITY);
            let hs = &mut hi[..held * n];
            screen_tiles_multi(isa, &tiles, 0, black_box(&sxs), hs, &mut lo).unwrap();
            black_box(&hi);
        });
        println!(
            "screen lm_head Q8_0 {held}x{k} n={n} {isa:<10} {:>8.1} us packed tiles",
            s * 1e6
        );
        // Two threads, halves of the tiles (the backend's split).
        let half = held / 32 * 16;
        let s2 = time(Duration::from_millis(600), || {
            let (a, b) = hi[..held * n].split_at_mut(half * n);
            std::thread::scope(|sc| {
                let t = &tiles;
                let x = &sxs;
                sc.spawn(move || {
                    let mut lo = vec![f32::NEG_INFINITY; n];
                    screen_tiles_multi(isa, t, 0, x, a, &mut lo).unwrap();
                });
                let mut lo = vec![f32::NEG_INFINITY; n];
                screen_tiles_multi(isa, t, half, x, &mut b[..(held - half) * n], &mut lo).unwrap();
            });
        });
        println!("  two threads {:>8.1} us", s2 * 1e6);
    }
}

fn bench_gemm(name: &str, ty: GgmlType, rows: usize, k: usize, n: usize) {
    let w = weights(ty, rows, k);
    let x = acts(n * k);
    let mut y = vec![0.0f32; n * rows];
    let packed = w.len() / rows;
    let flops = 2.0 * (rows * k * n) as f64;
    let mut base = 0.0;
    for isa in isas() {
        let budget = Duration::from_millis(if isa == Isa::Scalar { 300 } else { 600 });
        let s = time(budget, || {
            gemm(isa, ty, &w, packed, k, black_box(&x), n, &mut y, rows).unwrap();
        });
        if isa == Isa::Scalar {
            base = s;
        }
        // The same work as n GEMVs, for the prefill-vs-decode comparison.
        let mut yv = vec![0.0f32; rows];
        let sv = time(Duration::from_millis(300), || {
            for t in 0..n {
                gemv(isa, ty, &w, packed, k, black_box(&x[t * k..][..k]), &mut yv).unwrap();
            }
        });
        println!(
            "gemm {name:<22} {ty:<5} {rows:>5}x{k:<5} n={n:<3} {isa:<7} {:>8.1} us {:>7.1} GFLOP/s  x{:.1} vs scalar, x{:.1} vs {n} gemvs",
            s * 1e6,
            flops / s / 1e9,
            base / s,
            sv / s
        );
    }
}

/// Per-token fork/join: 2-way split of a layer-sized GEMV, and the bare
/// cost of a fork/join with empty tasks.
fn bench_pool() {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let pool = Pool::new(threads);
    let rp = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let budget = Duration::from_millis(800);

    let empty_pool = time(budget, || {
        pool.run(threads, |i| {
            black_box(i);
        })
    });
    let empty_rayon = time(budget, || {
        rp.scope(|s| {
            for i in 0..threads {
                s.spawn(move |_| {
                    black_box(i);
                });
            }
        })
    });
    let empty_join = time(budget, || {
        rp.install(|| rayon::join(|| black_box(0), || black_box(1)));
    });
    println!(
        "fork/join {threads} threads, empty tasks: pool {:.2} us, rayon scope {:.2} us, rayon join {:.2} us",
        empty_pool * 1e6,
        empty_rayon * 1e6,
        empty_join * 1e6
    );

    let isa = Isa::detect();
    for (ty, rows, k) in [(GgmlType::Q5_0, 2048, 640), (GgmlType::Q8_0, 1024, 640)] {
        let w = weights(ty, rows, k);
        let packed = w.len() / rows;
        let x = acts(k);
        let mut y = vec![0.0f32; rows];
        let chunk = rows.div_ceil(threads);
        let one = time(budget, || {
            gemv(isa, ty, &w, packed, k, &x, &mut y).unwrap();
        });
        // Rows are split into disjoint output chunks; the pool hands each
        // task a raw index, so outputs go through per-task slices.
        let outs: Vec<std::sync::Mutex<&mut [f32]>> =
            y.chunks_mut(chunk).map(std::sync::Mutex::new).collect();
        let p = time(budget, || {
            pool.run(outs.len(), |i| {
                let mut o = outs[i].lock().unwrap();
                let r0 = i * chunk;
                gemv(
                    isa,
                    ty,
                    &w[r0 * packed..][..o.len() * packed],
                    packed,
                    k,
                    &x,
                    &mut o,
                )
                .unwrap();
            })
        });
        drop(outs);
        let r = time(budget, || {
            rp.scope(|s| {
                for (i, o) in y.chunks_mut(chunk).enumerate() {
                    let (w, x) = (&w, &x);
                    s.spawn(move |_| {
                        let r0 = i * chunk;
                        gemv(
                            isa,
                            ty,
                            &w[r0 * packed..][..o.len() * packed],
                            packed,
                            k,
                            x,
                            o,
                        )
                        .unwrap();
                    });
                }
            })
        });
        println!(
            "split gemv {ty} {rows}x{k} ({isa}): 1 thread {:.1} us, pool {:.1} us, rayon {:.1} us; x360 per token: pool {:.2} ms, rayon {:.2} ms",
            one * 1e6,
            p * 1e6,
            r * 1e6,
            p * 360.0 * 1e3,
            r * 360.0 * 1e3
        );
    }
}

fn main() {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let on = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    println!(
        "cpu max {}, KILN_ISA/detect {}",
        Isa::cpu_max(),
        Isa::detect()
    );
    if on("gemv") {
        bench_gemv("lm_head/token_embd", GgmlType::Q8_0, 262144, 640);
        bench_gemv("attn_q", GgmlType::Q5_0, 1024, 640);
        bench_gemv("dram", GgmlType::Q5_0, 262144, 640);
        bench_gemv("ffn_gate/up", GgmlType::Q5_0, 2048, 640);
        bench_gemv("attn_v", GgmlType::Q8_0, 256, 640);
        bench_gemv("attn_output", GgmlType::Q4K, 640, 1024);
        bench_gemv("ffn_down", GgmlType::Q6K, 640, 2048);
        bench_gemv("ffn_down", GgmlType::Q4K, 640, 2048);
        bench_gemv("q4_0", GgmlType::Q4_0, 2048, 640);
        bench_gemv("q5_k", GgmlType::Q5K, 640, 2048);
        bench_gemv("f16", GgmlType::F16, 2048, 640);
        bench_gemv("bf16", GgmlType::BF16, 2048, 640);
        bench_gemv("f32", GgmlType::F32, 2048, 640);
    }
    if on("tiles") {
        for n in [1, 2, 4, 8, 16, 64] {
            bench_gemv_tiles(GgmlType::Q5_0, 2048, 640, n);
            bench_gemv_tiles(GgmlType::Q4K, 640, 2048, n);
            bench_gemv_tiles(GgmlType::Q6K, 640, 2048, n);
        }
        bench_gemv_tiles(GgmlType::Q5_0, 65536, 640, 1);
        bench_gemv_tiles(GgmlType::Q4K, 16384, 2048, 1);
    }
    if on("argmax screen coarse") {
        bench_argmax(262144, 640);
        bench_screen(262144, 640);
        bench_screen(1024, 640);
        for n in [2, 4, 8, 16] {
            bench_screen_multi(32768, 640, n);
            bench_screen_multi(262144, 640, n);
        }
    }
    if on("gemm") {
        bench_gemm("ffn_gate/up", GgmlType::Q5_0, 2048, 640, 64);
        bench_gemm("ffn_down", GgmlType::Q6K, 640, 2048, 64);
        bench_gemm("attn_output", GgmlType::Q4K, 640, 1024, 64);
        bench_gemm("attn_v", GgmlType::Q8_0, 256, 640, 64);
        bench_gemm("f32", GgmlType::F32, 2048, 640, 64);
        bench_gemm("ffn_gate/up n=8", GgmlType::Q5_0, 2048, 640, 8);
        bench_gemm("ffn_gate/up n=16", GgmlType::Q5_0, 2048, 640, 16);
        bench_gemm("ffn_gate/up n=32", GgmlType::Q5_0, 2048, 640, 32);
        bench_gemm("ffn_down n=32", GgmlType::Q6K, 640, 2048, 32);
        bench_gemm("ffn_gate/up n=256", GgmlType::Q5_0, 2048, 640, 256);
        bench_gemm("1b ffn_down n=256", GgmlType::Q4K, 1152, 6912, 256);
    }
    if on("pool") {
        bench_pool();
    }
    if on("qx") {
        // Serial per decode matmul input (the other threads wait).
        for k in [640, 1024, 2048, 6912] {
            let x = acts(k);
            let mut qx = QuantX::new();
            let s = time(Duration::from_millis(300), || {
                qx.set(black_box(&x));
            });
            println!("QuantX::set k={k:<5} {:>7.2} us", s * 1e6);
        }
    }
}
