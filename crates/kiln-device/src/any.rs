//! [`AnyBackend`]: the CPU or the CUDA backend behind one [`Backend`], so
//! one build of the runtime, the CLI and the server runs on either. Each
//! op matches once on the backend and hands over the inner buffers; a
//! buffer of the other backend is an error, never a panic.

use std::sync::Arc;

use kiln_cpu::{CpuBackend, CpuBuf, CpuStep, CpuWeight};
use kiln_cuda::{CudaBackend, CudaBuf, CudaStep, CudaWeight};
use kiln_gguf::Gguf;
use kiln_model::{
    AttnParams, Backend, GraphKey, HeadsPart, KvBinding, KvDst, KvStore, ModelError, PastKv,
    Result, RopeConfig, StepInput,
};

pub enum AnyBackend {
    Cpu(CpuBackend),
    /// Boxed: the CUDA backend's handles are large, the CPU's two pointers.
    Cuda(Box<CudaBackend>),
}

impl AnyBackend {
    /// `CPU` or `CUDA`.
    pub fn kind(&self) -> &'static str {
        match self {
            AnyBackend::Cpu(_) => "CPU",
            AnyBackend::Cuda(_) => "CUDA",
        }
    }

    /// The CPU kernels' instruction set, or the GPU's name.
    pub fn detail(&self) -> String {
        match self {
            AnyBackend::Cpu(b) => b.isa().name().to_string(),
            AnyBackend::Cuda(b) => b.device_name(),
        }
    }
}

pub enum AnyBuf {
    Cpu(CpuBuf),
    Cuda(CudaBuf),
}

pub enum AnyStep {
    Cpu(CpuStep),
    Cuda(CudaStep),
}

pub enum AnyWeight {
    Cpu(CpuWeight),
    Cuda(CudaWeight),
}

/// One side of the enums: how to reach its inner values.
trait Side {
    type B: Backend;
    fn buf(x: &AnyBuf) -> Result<&<Self::B as Backend>::Buf>;
    fn buf_mut(x: &mut AnyBuf) -> Result<&mut <Self::B as Backend>::Buf>;
    fn wrap_buf(x: <Self::B as Backend>::Buf) -> AnyBuf;
    fn take_buf(x: AnyBuf) -> Option<<Self::B as Backend>::Buf>;
    fn step(x: &AnyStep) -> Result<&<Self::B as Backend>::Step>;
    fn step_mut(x: &mut AnyStep) -> Result<&mut <Self::B as Backend>::Step>;
    fn weight(x: &AnyWeight) -> Result<&<Self::B as Backend>::Weight>;
    fn wrap_weight(x: <Self::B as Backend>::Weight) -> AnyWeight;
}

fn mixed(what: &str) -> ModelError {
    ModelError::Backend(format!("a {what} of one device passed to another"))
}

macro_rules! side {
    ($side:ident, $b:ty, $v:ident) => {
        struct $side;
        impl Side for $side {
            type B = $b;
            fn buf(x: &AnyBuf) -> Result<&<$b as Backend>::Buf> {
                match x {
                    AnyBuf::$v(x) => Ok(x),
                    #[allow(unreachable_patterns)]
                    _ => Err(mixed("buffer")),
                }
            }
            fn buf_mut(x: &mut AnyBuf) -> Result<&mut <$b as Backend>::Buf> {
                match x {
                    AnyBuf::$v(x) => Ok(x),
                    #[allow(unreachable_patterns)]
                    _ => Err(mixed("buffer")),
                }
            }
            fn wrap_buf(x: <$b as Backend>::Buf) -> AnyBuf {
                AnyBuf::$v(x)
            }
            fn take_buf(x: AnyBuf) -> Option<<$b as Backend>::Buf> {
                match x {
                    AnyBuf::$v(x) => Some(x),
                    #[allow(unreachable_patterns)]
                    _ => None,
                }
            }
            fn step(x: &AnyStep) -> Result<&<$b as Backend>::Step> {
                match x {
                    AnyStep::$v(x) => Ok(x),
                    #[allow(unreachable_patterns)]
                    _ => Err(mixed("step buffer")),
                }
            }
            fn step_mut(x: &mut AnyStep) -> Result<&mut <$b as Backend>::Step> {
                match x {
                    AnyStep::$v(x) => Ok(x),
                    #[allow(unreachable_patterns)]
                    _ => Err(mixed("step buffer")),
                }
            }
            fn weight(x: &AnyWeight) -> Result<&<$b as Backend>::Weight> {
                match x {
                    AnyWeight::$v(x) => Ok(x),
                    #[allow(unreachable_patterns)]
                    _ => Err(mixed("weight")),
                }
            }
            fn wrap_weight(x: <$b as Backend>::Weight) -> AnyWeight {
                AnyWeight::$v(x)
            }
        }
    };
}
side!(OnCpu, CpuBackend, Cpu);
side!(OnCuda, CudaBackend, Cuda);

/// Runs `$body` with `$b` the inner backend and `$S` its [`Side`].
macro_rules! on {
    ($self:expr, |$b:ident, $S:ident| $body:expr) => {
        match $self {
            AnyBackend::Cpu($b) => {
                #[allow(dead_code)]
                type $S = OnCpu;
                $body
            }
            AnyBackend::Cuda($b) => {
                #[allow(dead_code)]
                type $S = OnCuda;
                $body
            }
        }
    };
}

/// `PastKv` of the inner backend.
fn past<'a, S: Side>(p: Option<PastKv<'a, AnyBackend>>) -> Result<Option<PastKv<'a, S::B>>> {
    p.map(|p| {
        Ok(PastKv {
            k: S::buf(p.k)?,
            v: S::buf(p.v)?,
            start: p.start,
            rows: p.rows,
        })
    })
    .transpose()
}

/// `KILN_INJECT_NAN=N` (testing the non-finite paths): the `N`-th forward
/// pass of the process (counting embeddings from 1) gets a NaN in its
/// first row. Once per process, on whichever backend runs it (a CUDA step
/// captured into a graph then keeps it on replay: the retry on the CPU is
/// what the switch is for).
fn inject_nan_now() -> bool {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static AT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let at = *AT.get_or_init(|| {
        std::env::var("KILN_INJECT_NAN")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    });
    at != 0 && CALLS.fetch_add(1, Ordering::Relaxed) + 1 == at
}

impl Backend for AnyBackend {
    type Buf = AnyBuf;
    type Step = AnyStep;
    type Weight = AnyWeight;

    fn name(&self) -> &str {
        on!(self, |b, S| b.name())
    }

    fn load_weight(&self, gguf: &Arc<Gguf>, name: &str) -> Result<AnyWeight> {
        match self {
            AnyBackend::Cpu(b) => b.load_weight(gguf, name).map(AnyWeight::Cpu),
            AnyBackend::Cuda(b) => b.load_weight(gguf, name).map(AnyWeight::Cuda),
        }
    }

    fn weight_shape(&self, w: &AnyWeight) -> (usize, usize) {
        match (self, w) {
            (AnyBackend::Cpu(b), AnyWeight::Cpu(w)) => b.weight_shape(w),
            (AnyBackend::Cuda(b), AnyWeight::Cuda(w)) => b.weight_shape(w),
            // Weights come from `load_weight` of this backend; a foreign
            // one has no shape here, which every caller's checks reject.
            _ => (0, 0),
        }
    }

    fn alloc(&self, len: usize) -> Result<AnyBuf> {
        on!(self, |b, S| b.alloc(len).map(S::wrap_buf))
    }

    fn upload(&self, data: &[f32]) -> Result<AnyBuf> {
        on!(self, |b, S| b.upload(data).map(S::wrap_buf))
    }

    fn buf_len(&self, x: &AnyBuf) -> usize {
        on!(self, |b, S| S::buf(x).map_or(0, |x| b.buf_len(x)))
    }

    fn download(&self, x: &AnyBuf, offset: usize, out: &mut [f32]) -> Result<()> {
        on!(self, |b, S| b.download(S::buf(x)?, offset, out))
    }

    fn new_step(&self, max_rows: usize) -> Result<AnyStep> {
        match self {
            AnyBackend::Cpu(b) => b.new_step(max_rows).map(AnyStep::Cpu),
            AnyBackend::Cuda(b) => b.new_step(max_rows).map(AnyStep::Cuda),
        }
    }

    fn load_step(&self, input: &StepInput, step: &mut AnyStep) -> Result<()> {
        on!(self, |b, S| b.load_step(input, S::step_mut(step)?))
    }

    fn read_ids(&self, step: &AnyStep, out: &mut [u32]) -> Result<()> {
        on!(self, |b, S| b.read_ids(S::step(step)?, out))
    }

    fn embed(
        &self,
        table: &AnyWeight,
        step: &AnyStep,
        n_tok: usize,
        scale: f32,
        out: &mut AnyBuf,
    ) -> Result<()> {
        on!(self, |b, S| b.embed(
            S::weight(table)?,
            S::step(step)?,
            n_tok,
            scale,
            S::buf_mut(out)?
        ))?;
        if inject_nan_now() {
            // x·NaN: a real non-finite value in the first row, for the
            // detection and the CPU retry to find.
            self.scale(out, f32::NAN, 1)?;
        }
        Ok(())
    }

    fn matmul(
        &self,
        w: &AnyWeight,
        row0: usize,
        n_rows: usize,
        x: &AnyBuf,
        n_tok: usize,
        out: &mut AnyBuf,
    ) -> Result<()> {
        on!(self, |b, S| b.matmul(
            S::weight(w)?,
            row0,
            n_rows,
            S::buf(x)?,
            n_tok,
            S::buf_mut(out)?
        ))
    }

    fn rms_norm(
        &self,
        x: &mut AnyBuf,
        n_groups: usize,
        dim: usize,
        w: Option<&AnyBuf>,
        eps: f32,
    ) -> Result<()> {
        on!(self, |b, S| b.rms_norm(
            S::buf_mut(x)?,
            n_groups,
            dim,
            w.map(S::buf).transpose()?,
            eps
        ))
    }

    fn rope(
        &self,
        x: &mut AnyBuf,
        n_tok: usize,
        n_heads: usize,
        head_dim: usize,
        step: &AnyStep,
        rope: &RopeConfig,
    ) -> Result<()> {
        on!(self, |b, S| b.rope(
            S::buf_mut(x)?,
            n_tok,
            n_heads,
            head_dim,
            S::step(step)?,
            rope
        ))
    }

    fn attention(
        &self,
        q: &AnyBuf,
        cur_k: &AnyBuf,
        cur_v: &AnyBuf,
        past_kv: Option<PastKv<'_, Self>>,
        p: &AttnParams,
        step: &AnyStep,
        out: &mut AnyBuf,
    ) -> Result<()> {
        on!(self, |b, S| b.attention(
            S::buf(q)?,
            S::buf(cur_k)?,
            S::buf(cur_v)?,
            past::<S>(past_kv)?,
            p,
            S::step(step)?,
            S::buf_mut(out)?
        ))
    }

    fn store_kv(
        &self,
        k: &AnyBuf,
        v: &AnyBuf,
        src_row0: usize,
        dst: KvDst<'_, Self>,
        n: usize,
        p0: usize,
        seq: usize,
        step: &AnyStep,
    ) -> Result<()> {
        on!(self, |b, S| {
            let dst = KvDst {
                k: S::buf_mut(dst.k)?,
                v: S::buf_mut(dst.v)?,
                rows: dst.rows,
                row_len: dst.row_len,
                ring: dst.ring,
            };
            b.store_kv(
                S::buf(k)?,
                S::buf(v)?,
                src_row0,
                dst,
                n,
                p0,
                seq,
                S::step(step)?,
            )
        })
    }

    // The fused ops: every one is forwarded, or the inner backend's
    // kernels would be replaced by the trait's unfused defaults.
    fn concat_rows(&self, parts: &[&AnyWeight]) -> Result<Option<AnyWeight>> {
        on!(self, |b, S| {
            let inner = parts
                .iter()
                .map(|w| S::weight(w))
                .collect::<Result<Vec<_>>>()?;
            Ok(b.concat_rows(&inner)?.map(S::wrap_weight))
        })
    }

    fn add_rms_norm(
        &self,
        y: &mut AnyBuf,
        post: &AnyBuf,
        x: &mut AnyBuf,
        x_row0: usize,
        n: usize,
        d: usize,
        pre: Option<&AnyBuf>,
        eps: f32,
    ) -> Result<()> {
        on!(self, |b, S| b.add_rms_norm(
            S::buf_mut(y)?,
            S::buf(post)?,
            S::buf_mut(x)?,
            x_row0,
            n,
            d,
            pre.map(S::buf).transpose()?,
            eps
        ))
    }

    fn split_heads(
        &self,
        src: &AnyBuf,
        n_tok: usize,
        head_dim: usize,
        parts: &mut [HeadsPart<'_, Self>],
        rope: &RopeConfig,
        eps: f32,
        step: &AnyStep,
    ) -> Result<()> {
        on!(self, |b, S| {
            let mut inner = parts
                .iter_mut()
                .map(|p| {
                    Ok(HeadsPart {
                        dst: S::buf_mut(p.dst)?,
                        heads: p.heads,
                        norm: p.norm.map(S::buf).transpose()?,
                        rope: p.rope,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            b.split_heads(
                S::buf(src)?,
                n_tok,
                head_dim,
                &mut inner,
                rope,
                eps,
                S::step(step)?,
            )
        })
    }

    fn gelu_mul_halves(
        &self,
        gu: &AnyBuf,
        n_tok: usize,
        ff: usize,
        out: &mut AnyBuf,
    ) -> Result<()> {
        on!(self, |b, S| b.gelu_mul_halves(
            S::buf(gu)?,
            n_tok,
            ff,
            S::buf_mut(out)?
        ))
    }

    fn attention_batch<'c>(
        &self,
        layer: usize,
        q: &AnyBuf,
        cur_k: &AnyBuf,
        cur_v: &AnyBuf,
        pasts: &mut dyn Iterator<Item = Option<PastKv<'c, Self>>>,
        params: &[AttnParams],
        step: &AnyStep,
        out: &mut AnyBuf,
    ) -> Result<()> {
        on!(self, |b, S| {
            // A foreign cache fails the call once the inner one returns.
            let mut bad = None;
            let mut inner = pasts.map(|p| {
                past::<S>(p).unwrap_or_else(|e| {
                    bad.get_or_insert(e);
                    None
                })
            });
            let r = b.attention_batch(
                layer,
                S::buf(q)?,
                S::buf(cur_k)?,
                S::buf(cur_v)?,
                &mut inner,
                params,
                S::step(step)?,
                S::buf_mut(out)?,
            );
            drop(inner);
            bad.map_or(r, Err)
        })
    }

    fn bind_kv(
        &self,
        step: &mut AnyStep,
        seq: usize,
        layer: usize,
        kv: Option<KvBinding<'_, Self>>,
    ) -> Result<()> {
        on!(self, |b, S| {
            let kv = match kv {
                Some(kv) => Some(KvBinding {
                    k: S::buf(kv.k)?,
                    v: S::buf(kv.v)?,
                    rows: kv.rows,
                }),
                None => None,
            };
            b.bind_kv(S::step_mut(step)?, seq, layer, kv)
        })
    }

    fn replays_steps(&self) -> bool {
        on!(self, |b, S| b.replays_steps())
    }

    fn store_kv_batch<'c>(
        &self,
        layer: usize,
        k: &AnyBuf,
        v: &AnyBuf,
        stores: &mut dyn Iterator<Item = Result<KvStore<'c, Self>>>,
        step: &AnyStep,
    ) -> Result<()> {
        on!(self, |b, S| {
            let mut inner = stores.map(|st| {
                let st = st?;
                Ok(KvStore {
                    dst: KvDst {
                        k: S::buf_mut(st.dst.k)?,
                        v: S::buf_mut(st.dst.v)?,
                        rows: st.dst.rows,
                        row_len: st.dst.row_len,
                        ring: st.dst.ring,
                    },
                    src_row0: st.src_row0,
                    n: st.n,
                    p0: st.p0,
                    seq: st.seq,
                })
            });
            b.store_kv_batch(layer, S::buf(k)?, S::buf(v)?, &mut inner, S::step(step)?)
        })
    }

    fn gelu_mul(&self, gate: &mut AnyBuf, up: &AnyBuf, n: usize) -> Result<()> {
        on!(self, |b, S| b.gelu_mul(S::buf_mut(gate)?, S::buf(up)?, n))
    }

    fn add(&self, x: &mut AnyBuf, y: &AnyBuf, n: usize) -> Result<()> {
        on!(self, |b, S| b.add(S::buf_mut(x)?, S::buf(y)?, n))
    }

    fn scale(&self, x: &mut AnyBuf, s: f32, n: usize) -> Result<()> {
        on!(self, |b, S| b.scale(S::buf_mut(x)?, s, n))
    }

    fn copy_strided(
        &self,
        src: &AnyBuf,
        src_off: usize,
        src_stride: usize,
        dst: &mut AnyBuf,
        dst_off: usize,
        dst_stride: usize,
        rows: usize,
        len: usize,
        alpha: f32,
        accumulate: bool,
    ) -> Result<()> {
        on!(self, |b, S| b.copy_strided(
            S::buf(src)?,
            src_off,
            src_stride,
            S::buf_mut(dst)?,
            dst_off,
            dst_stride,
            rows,
            len,
            alpha,
            accumulate
        ))
    }

    fn lm_head(
        &self,
        w: &AnyWeight,
        h: &AnyBuf,
        n_tok: usize,
        softcap: Option<f32>,
        out: &mut AnyBuf,
    ) -> Result<()> {
        on!(self, |b, S| b.lm_head(
            S::weight(w)?,
            S::buf(h)?,
            n_tok,
            softcap,
            S::buf_mut(out)?
        ))
    }

    fn lm_head_to_host(
        &self,
        w: &AnyWeight,
        h: &AnyBuf,
        n_tok: usize,
        softcap: Option<f32>,
        buf: &mut Option<AnyBuf>,
        out: &mut [f32],
    ) -> Result<()> {
        on!(self, |b, S| {
            // The caller keeps the logits buffer; lend it to the inner
            // backend and take back what it grew.
            let mut inner = buf.take().and_then(S::take_buf);
            let r = b.lm_head_to_host(S::weight(w)?, S::buf(h)?, n_tok, softcap, &mut inner, out);
            *buf = inner.map(S::wrap_buf);
            r
        })
    }

    fn softcap(&self, x: &mut AnyBuf, c: f32, n: usize) -> Result<()> {
        on!(self, |b, S| b.softcap(S::buf_mut(x)?, c, n))
    }

    fn argmax_head(
        &self,
        w: &AnyWeight,
        h: &AnyBuf,
        rows: std::ops::Range<usize>,
        step: &mut AnyStep,
    ) -> Result<()> {
        on!(self, |b, S| b.argmax_head(
            S::weight(w)?,
            S::buf(h)?,
            rows.clone(),
            S::step_mut(step)?
        ))
    }

    fn bind_sampler(&self, step: &mut AnyStep, j: usize, state: Option<&AnyBuf>) -> Result<()> {
        on!(self, |b, S| {
            let state = state.map(S::buf).transpose()?;
            b.bind_sampler(S::step_mut(step)?, j, state)
        })
    }

    fn sample_head(
        &self,
        w: &AnyWeight,
        h: &AnyBuf,
        rows: std::ops::Range<usize>,
        softcap: Option<f32>,
        states: &mut dyn Iterator<Item = Option<&mut AnyBuf>>,
        logits: &mut AnyBuf,
        step: &mut AnyStep,
    ) -> Result<()> {
        on!(self, |b, S| {
            // A foreign state fails the call once the inner one returns.
            let mut bad = None;
            let mut inner = states.map(|st| {
                st.map(S::buf_mut).transpose().unwrap_or_else(|e| {
                    bad.get_or_insert(e);
                    None
                })
            });
            let r = b.sample_head(
                S::weight(w)?,
                S::buf(h)?,
                rows.clone(),
                softcap,
                &mut inner,
                S::buf_mut(logits)?,
                S::step_mut(step)?,
            );
            drop(inner);
            bad.map_or(r, Err)
        })
    }

    fn run_step(&self, key: Option<GraphKey>, f: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        on!(self, |b, S| b.run_step(key, f))
    }

    fn device_memory_free(&self) -> Option<usize> {
        on!(self, |b, S| b.device_memory_free())
    }

    fn cpu_fallback(&self, threads: usize) -> Option<Self> {
        match self {
            AnyBackend::Cpu(_) => None,
            AnyBackend::Cuda(_) => Some(AnyBackend::Cpu(CpuBackend::with_threads(threads))),
        }
    }
}
