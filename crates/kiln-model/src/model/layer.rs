//! One decoder layer over a step's rows (attention, feed-forward or
//! mixture of experts, Gemma 4's per-layer inputs), on the backend's ops.

use super::*;

impl<B: Backend> Model<B> {
    /// Gemma 4 PLE: `ple = (rms(proj·x0 / sqrt(d)) + E_ple[tok]·sqrt(P)) / sqrt(2)`.
    pub(super) fn per_layer_inputs(
        &self,
        ple: &GlobalPle<B>,
        n: usize,
        s: &mut Scratch<B>,
    ) -> Result<()> {
        let b = &self.backend;
        let cfg = &self.config;
        let p = cfg.ple_dim;
        let w = cfg.n_layer * p;
        b.embed(
            &ple.token_embd,
            &s.step,
            n,
            (p as f32).sqrt(),
            &mut s.ple_tok,
        )?;
        b.matmul(&ple.model_proj, 0, w, &s.x, n, &mut s.ple)?;
        b.scale(&mut s.ple, 1.0 / (cfg.n_embd as f32).sqrt(), n * w)?;
        b.rms_norm(
            &mut s.ple,
            n * cfg.n_layer,
            p,
            Some(&ple.proj_norm),
            cfg.rms_eps,
        )?;
        b.add(&mut s.ple, &s.ple_tok, n * w)?;
        b.scale(&mut s.ple, std::f32::consts::FRAC_1_SQRT_2, n * w)?;
        Ok(())
    }

    /// One layer over the step's rows. On entry `s.h` holds its normed
    /// input when `h_ready` (else it norms `s.x` itself); returns whether on
    /// exit `s.h` holds `next_norm` of the residual stream (the next layer's
    /// input, or the final norm), folded into its last op where it can.
    pub(super) fn layer(
        &self,
        l: &LayerConfig,
        w: &LayerWeights<B>,
        next_norm: Option<&B::Buf>,
        h_ready: bool,
        seqs: &mut [BatchSeq<'_, B>],
        s: &mut Scratch<B>,
    ) -> Result<bool> {
        let n = s.input.rows();
        let b = &self.backend;
        let cfg = &self.config;
        let d = cfg.n_embd;
        let eps = cfg.rms_eps;
        let (hd, il) = (l.head_dim, l.index);

        // --- attention ---
        if !h_ready {
            b.copy_strided(&s.x, 0, 0, &mut s.h, 0, 0, 1, n * d, 1.0, false)?;
            b.rms_norm(&mut s.h, n, d, Some(&w.attn_norm), eps)?;
        }
        let dump = self.dump_layer0 && il == 0;
        if dump {
            self.tap("attn_norm", &s.h, n * d)?;
        }
        // Layers whose K/V later layers read keep their own batch buffers;
        // the others share one pair and store it right after attention.
        let deferred = s.chunk_k[il].is_some();
        if w.fused_kv > 0 {
            self.fused_qkv(l, w, s)?;
        } else {
            b.matmul(&w.q, 0, l.q_dim(), &s.h, n, &mut s.q_up)?;
            if let Some(qn) = &w.q_norm {
                b.rms_norm(&mut s.q_up, n * l.n_head, hd, Some(qn), eps)?;
            }
            b.rope(&mut s.q_up, n, l.n_head, hd, &s.step, &l.rope)?;
        }
        if dump {
            self.tap("q_norm_rope", &s.q_up, n * l.q_dim())?;
        }
        if l.owns_kv() && w.fused_kv == 0 {
            let (ck, cv) = match (s.chunk_k[il].as_mut(), s.chunk_v[il].as_mut()) {
                (Some(k), Some(v)) => (k, v),
                _ => (&mut s.layer_k, &mut s.layer_v),
            };
            let wk = w.k.as_ref().ok_or_else(|| ModelError::MissingTensor {
                name: format!("blk.{il}.attn_k.weight"),
            })?;
            b.matmul(wk, 0, l.kv_dim(), &s.h, n, ck)?;
            match &w.v {
                Some(wv) => b.matmul(wv, 0, l.kv_dim(), &s.h, n, cv)?,
                // K=V: V is the raw K projection, before k_norm and RoPE.
                None => b.copy_strided(ck, 0, 0, cv, 0, 0, 1, n * l.kv_dim(), 1.0, false)?,
            }
            if l.v_norm {
                b.rms_norm(cv, n * l.n_kv_head, hd, None, eps)?;
            }
            if let Some(kn) = &w.k_norm {
                b.rms_norm(ck, n * l.n_kv_head, hd, Some(kn), eps)?;
            }
            b.rope(ck, n, l.n_kv_head, hd, &s.step, &l.rope)?;
        }
        if dump && l.owns_kv() {
            let ck = s.chunk_k[il].as_ref().unwrap_or(&s.layer_k);
            self.tap("k_norm_rope", ck, n * l.kv_dim())?;
        }
        let src = l.kv_source;
        let (ck, cv) = match (s.chunk_k[src].as_ref(), s.chunk_v[src].as_ref()) {
            (Some(k), Some(v)) => (k, v),
            _ if src == il => (&s.layer_k, &s.layer_v),
            _ => return Err(ModelError::Backend(format!("layer {src}: no K/V scratch"))),
        };
        // Attention of every sequence (padding ones too), each over its
        // own cache, in one call.
        s.params.clear();
        for (i, sp) in s.input.seqs.iter().enumerate() {
            s.params.push(AttnParams {
                n_tok: sp.n_rows,
                p0: sp.p0,
                row0: sp.row0,
                seq: i,
                n_head: l.n_head,
                n_kv_head: l.n_kv_head,
                head_dim: hd,
                scale: l.attn_scale,
                softcap: cfg.attn_softcap,
                window: l.window,
            });
        }
        let mut pasts =
            (0..s.input.seqs.len()).map(|i| seqs.get(i).and_then(|q| q.cache.past(src)));
        b.attention_batch(
            src,
            &s.q_up,
            ck,
            cv,
            &mut pasts,
            &s.params,
            &s.step,
            &mut s.attn_gate,
        )?;
        if l.owns_kv() && !deferred {
            store_batch(b, il, seqs, &s.layer_k, &s.layer_v, &s.input, &s.step)?;
        }
        if dump {
            self.tap("attn_out", &s.attn_gate, n * l.q_dim())?;
        }
        // The projections' input is dead: the output projection reuses it.
        b.matmul(&w.o, 0, d, &s.attn_gate, n, &mut s.h)?;
        // In one feed-forward chunk (every decode step) the add also norms
        // the feed-forward's input.
        let one_chunk = n <= s.ffn_rows && !dump;
        let ffn_norm = one_chunk.then_some(&w.ffn_norm);
        b.add_rms_norm(
            &mut s.h,
            &w.post_attn_norm,
            &mut s.x,
            0,
            n,
            d,
            ffn_norm,
            eps,
        )?;
        if dump {
            self.tap("attn_post_norm", &s.h, n * d)?;
        }

        // --- feed-forward, `s.ffn_rows` rows at a time (every step is per
        // row; MoE layers take the whole batch) ---
        // The next layer's input norm folds into the last add when nothing
        // else touches the residual stream in between.
        let fold_next = one_chunk && w.ple.is_none() && w.output_scale == 1.0;
        let mut h_next = false;
        let mut ffn_out = Vec::new();
        for r0 in (0..n).step_by(s.ffn_rows) {
            let m = s.ffn_rows.min(n - r0);
            if !one_chunk {
                b.copy_strided(&s.x, r0 * d, 0, &mut s.h, 0, 0, 1, m * d, 1.0, false)?;
                b.rms_norm(&mut s.h, m, d, Some(&w.ffn_norm), eps)?;
            }
            match &w.up {
                Some(up) => {
                    b.matmul(&w.gate, 0, l.ffn, &s.h, m, &mut s.attn_gate)?;
                    b.matmul(up, 0, l.ffn, &s.h, m, &mut s.q_up)?;
                    b.gelu_mul(&mut s.attn_gate, &s.q_up, m * l.ffn)?;
                }
                None => {
                    b.matmul(&w.gate, 0, 2 * l.ffn, &s.h, m, &mut s.q_up)?;
                    b.gelu_mul_halves(&s.q_up, m, l.ffn, &mut s.attn_gate)?;
                }
            }
            let Some(mw) = &w.moe else {
                // The block's input is dead: its output takes `s.h`.
                b.matmul(&w.down, 0, d, &s.attn_gate, m, &mut s.h)?;
                let pre = if fold_next { next_norm } else { None };
                b.add_rms_norm(&mut s.h, &w.post_ffw_norm, &mut s.x, r0, m, d, pre, eps)?;
                h_next = pre.is_some();
                if dump {
                    let at = ffn_out.len();
                    ffn_out.resize(at + m * d, 0.0);
                    b.download(&s.h, 0, &mut ffn_out[at..])?;
                }
                continue;
            };
            if m != n {
                return Err(ModelError::Backend(format!(
                    "layer {il}: MoE feed-forward on {m} of {n} rows"
                )));
            }
            b.matmul(&w.down, 0, d, &s.attn_gate, m, &mut s.o)?;
            b.rms_norm(&mut s.o, n, d, Some(&mw.post_norm_1), eps)?;
            self.moe(l, mw, n, s)?;
            b.rms_norm(&mut s.moe_out, n, d, Some(&mw.post_norm_2), eps)?;
            b.add(&mut s.o, &s.moe_out, n * d)?;
            b.rms_norm(&mut s.o, n, d, Some(&w.post_ffw_norm), eps)?;
            if dump {
                let at = ffn_out.len();
                ffn_out.resize(at + m * d, 0.0);
                b.download(&s.o, 0, &mut ffn_out[at..])?;
            }
            b.copy_strided(&s.o, 0, 0, &mut s.x, r0 * d, 0, 1, m * d, 1.0, true)?;
        }
        if dump {
            tap_host("ffn_out", &ffn_out);
        }

        // --- Gemma 4 per-layer input ---
        if let Some(pl) = &w.ple {
            let p = cfg.ple_dim;
            b.matmul(&pl.inp_gate, 0, p, &s.x, n, &mut s.ple_gate)?;
            b.copy_strided(
                &s.ple,
                il * p,
                cfg.n_layer * p,
                &mut s.ple_slice,
                0,
                p,
                n,
                p,
                1.0,
                false,
            )?;
            b.gelu_mul(&mut s.ple_gate, &s.ple_slice, n * p)?;
            b.matmul(&pl.proj, 0, d, &s.ple_gate, n, &mut s.h)?;
            b.rms_norm(&mut s.h, n, d, Some(&pl.post_norm), eps)?;
            b.add(&mut s.x, &s.h, n * d)?;
        }
        if w.output_scale != 1.0 {
            b.scale(&mut s.x, w.output_scale, n * d)?;
        }
        if dump {
            self.tap("layer_out", &s.x, n * d)?;
        }
        Ok(h_next)
    }

    /// q, k (and v) of a layer whose projections the backend fused: one
    /// matmul into `s.attn_gate` (free until attention writes it), split
    /// into `s.q_up` and the layer's K/V scratch with the per-head norms
    /// and RoPE on the way.
    fn fused_qkv(&self, l: &LayerConfig, w: &LayerWeights<B>, s: &mut Scratch<B>) -> Result<()> {
        let b = &self.backend;
        let n = s.input.rows();
        let (hd, il, kvd) = (l.head_dim, l.index, l.kv_dim());
        let width = l.q_dim() + w.fused_kv * kvd;
        b.matmul(&w.q, 0, width, &s.h, n, &mut s.attn_gate)?;
        let (ck, cv) = match (s.chunk_k[il].as_mut(), s.chunk_v[il].as_mut()) {
            (Some(k), Some(v)) => (k, v),
            _ => (&mut s.layer_k, &mut s.layer_v),
        };
        if w.fused_kv == 1 {
            match &w.v {
                Some(wv) => b.matmul(wv, 0, kvd, &s.h, n, cv)?,
                // K=V: V is the raw K projection, before k_norm and RoPE.
                None => b.copy_strided(
                    &s.attn_gate,
                    l.q_dim(),
                    width,
                    cv,
                    0,
                    kvd,
                    n,
                    kvd,
                    1.0,
                    false,
                )?,
            }
            if l.v_norm {
                b.rms_norm(cv, n * l.n_kv_head, hd, None, self.config.rms_eps)?;
            }
        }
        let mut parts = [
            HeadsPart {
                dst: &mut s.q_up,
                heads: l.n_head,
                norm: w.q_norm.as_ref(),
                rope: true,
            },
            HeadsPart {
                dst: ck,
                heads: l.n_kv_head,
                norm: w.k_norm.as_ref(),
                rope: true,
            },
            HeadsPart {
                dst: cv,
                heads: l.n_kv_head,
                norm: None,
                rope: false,
            },
        ];
        let eps = self.config.rms_eps;
        let parts = &mut parts[..1 + w.fused_kv];
        b.split_heads(&s.attn_gate, n, hd, parts, &l.rope, eps, &s.step)
    }

    /// Routed experts into `s.moe_out` (before `post_ffw_norm_2`). The router
    /// reads the raw residual `s.x`; experts read `pre_ffw_norm_2(x)`.
    fn moe(&self, l: &LayerConfig, m: &MoeLayer<B>, n: usize, s: &mut Scratch<B>) -> Result<()> {
        let b = &self.backend;
        let cfg = &self.config;
        let d = cfg.n_embd;
        let mc = l.moe.as_ref().expect("moe weights imply moe config");
        let (ne, k, ff) = (mc.n_expert, mc.n_expert_used, mc.expert_ffn);

        b.copy_strided(&s.x, 0, 0, &mut s.h, 0, 0, 1, n * d, 1.0, false)?;
        b.rms_norm(&mut s.h, n, d, Some(&m.router_norm), cfg.rms_eps)?;
        b.matmul(&m.router, 0, ne, &s.h, n, &mut s.router)?;
        s.router_host.resize(n * ne, 0.0);
        b.download(&s.router, 0, &mut s.router_host)?;

        // Per expert: (token, weight) pairs.
        for list in s.expert_tokens.iter_mut() {
            list.clear();
        }
        s.expert_tokens.resize_with(ne, Vec::new);
        for t in 0..n {
            let row = &s.router_host[t * ne..(t + 1) * ne];
            let mx = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let probs = &mut s.router_probs;
            probs.clear();
            probs.extend(row.iter().map(|&z| (z - mx).exp()));
            let idx = &mut s.router_order;
            idx.clear();
            idx.extend(0..ne);
            // Stable sort: ties keep the lower expert id.
            idx.sort_by(|&a, &c| probs[c].total_cmp(&probs[a]));
            let top = &idx[..k.min(ne)];
            let sum: f32 = top.iter().map(|&e| probs[e]).sum();
            for &e in top {
                s.expert_tokens[e].push((t, probs[e] / sum * m.expert_scale[e]));
            }
        }

        b.copy_strided(&s.x, 0, 0, &mut s.h, 0, 0, 1, n * d, 1.0, false)?;
        b.rms_norm(&mut s.h, n, d, Some(&m.pre_norm_2), cfg.rms_eps)?;
        b.scale(&mut s.moe_out, 0.0, n * d)?;
        for e in 0..ne {
            let list = std::mem::take(&mut s.expert_tokens[e]);
            if list.is_empty() {
                s.expert_tokens[e] = list;
                continue;
            }
            let cnt = list.len();
            for (i, &(t, _)) in list.iter().enumerate() {
                b.copy_strided(&s.h, t * d, 0, &mut s.moe_x, i * d, 0, 1, d, 1.0, false)?;
            }
            match (&m.gate_up, &m.gate, &m.up) {
                (Some(gu), _, _) => {
                    b.matmul(gu, e * 2 * ff, ff, &s.moe_x, cnt, &mut s.moe_gate)?;
                    b.matmul(gu, e * 2 * ff + ff, ff, &s.moe_x, cnt, &mut s.moe_up)?;
                }
                (None, Some(g), Some(u)) => {
                    b.matmul(g, e * ff, ff, &s.moe_x, cnt, &mut s.moe_gate)?;
                    b.matmul(u, e * ff, ff, &s.moe_x, cnt, &mut s.moe_up)?;
                }
                _ => {
                    return Err(ModelError::MissingTensor {
                        name: format!("blk.{}.ffn_gate_up_exps.weight", l.index),
                    })
                }
            }
            b.gelu_mul(&mut s.moe_gate, &s.moe_up, cnt * ff)?;
            b.matmul(&m.down, e * d, d, &s.moe_gate, cnt, &mut s.moe_x)?;
            for (i, &(t, wgt)) in list.iter().enumerate() {
                b.copy_strided(
                    &s.moe_x,
                    i * d,
                    0,
                    &mut s.moe_out,
                    t * d,
                    0,
                    1,
                    d,
                    wgt,
                    true,
                )?;
            }
            s.expert_tokens[e] = list;
        }
        Ok(())
    }
}
