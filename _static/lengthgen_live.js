/*
 * lengthgen live panels: the book's position-only retrieval head, trained in the reader's browser.
 *
 * Two parts, both plain JavaScript (no framework; plotly.js, which the book serves from _static/,
 * draws the figures):
 *
 * 1. lengthgenCore, the trainer: the model of lengthgen_utils.models.RetrievalHead (queries and
 *    keys from a learned vector u plus the position signal; values through the per-token table
 *    E W_V^T W_O^T; weights stored [out, in], row-major), the encodings RoPE (half-split pairs),
 *    learned APE, NoPE and ALiBi (one function each), the forward pass and its gradients written
 *    out by hand, AdamW with torch's update formula and defaults (betas 0.9 / 0.999, eps 1e-8),
 *    the fixed-offset retrieval task, the package's initialisation scheme, accuracy by length and
 *    the offset kernel s(D) with its aliases (lengthgen_utils.kernel). Everything is float64.
 *    The function's own source text starts the Web Worker that trains (a Blob, so it also works
 *    when the book is opened from file://); the same function runs on the main thread for the tests.
 *
 * 2. The panels: every <div class="lg-live"> on the page (written by lengthgen_utils.live) gets
 *    its sliders; moving one retrains in the worker, with a progress bar and a status line, and
 *    redraws the panel's figure. Until then the panel shows the figure the book's build
 *    precomputed in Python.
 *
 * Random numbers come from the page's own generator (sfc32): the page trains other seeds than
 * torch, from the same distributions. The tests in tests/test_live_trainer.py feed the trainer
 * Python's initial parameters and batches and compare every step with torch in float64.
 */
(function () {
  "use strict";

  // ==============================================================================================
  // 1. The trainer. Self-contained: its source text is the Web Worker's script.
  // ==============================================================================================
  function lengthgenCore(scope) {
    "use strict";

    const BETA1 = 0.9;
    const BETA2 = 0.999;
    const EPS = 1e-8;
    const STREAM = { init: 1, data: 2, eval: 3 };

    // ------------------------------------------------------------------ random numbers
    /** A generator seeded by (seed, stream): sfc32 whose state comes from splitmix32. */
    function makeRng(seed, stream) {
      let s = (Math.imul(seed >>> 0, 0x9e3779b1) ^ Math.imul((stream >>> 0) + 1, 0x85ebca77)) >>> 0;
      function splitmix() {
        s = (s + 0x9e3779b9) >>> 0;
        let z = s;
        z = Math.imul(z ^ (z >>> 16), 0x21f0aaad);
        z = Math.imul(z ^ (z >>> 15), 0x735a2d97);
        return (z ^ (z >>> 15)) >>> 0;
      }
      let a = splitmix(), b = splitmix(), c = splitmix(), d = splitmix();
      function u32() {
        let t = (a + b) | 0;
        a = b ^ (b >>> 9);
        b = (c + (c << 3)) | 0;
        c = (c << 21) | (c >>> 11);
        d = (d + 1) | 0;
        t = (t + d) | 0;
        c = (c + t) | 0;
        return t >>> 0;
      }
      for (let i = 0; i < 15; i++) u32();
      let spare = null;
      const rng = {
        u32,
        /** An integer uniform in 0 .. n-1 (n <= 2^21). */
        int(n) { return Math.floor((u32() * n) / 4294967296); },
        /** A float uniform in [0, 1) with 53 random bits. */
        uniform() { return ((u32() >>> 5) * 67108864 + (u32() >>> 6)) / 9007199254740992; },
        /** A standard normal (Box-Muller, both values used). */
        normal() {
          if (spare !== null) { const v = spare; spare = null; return v; }
          let u1 = 0;
          while (u1 === 0) u1 = rng.uniform();
          const u2 = rng.uniform();
          const r = Math.sqrt(-2 * Math.log(u1));
          spare = r * Math.sin(2 * Math.PI * u2);
          return r * Math.cos(2 * Math.PI * u2);
        },
      };
      return rng;
    }

    // ------------------------------------------------------------------ position encodings
    // Each encoding is one function of the head's configuration returning the places where it acts
    // (lengthgen_utils.positional.Encoding): `table` (a learned table added to the input, APE),
    // `rotate` (a rotation of queries and keys, RoPE) or `bias` (added to the logit, ALiBi).
    const ENCODINGS = {
      /** No position signal (every key is the same vector). */
      nope() { return { name: "nope" }; },
      /** A learned table p_t added to u at position t, rows initialised N(0, 0.02^2). */
      ape(cfg) { return { name: "ape", table: { rows: cfg.maxLen, std: 0.02 } }; },
      /** Rotary: pair (i, i + d_head/2) rotated by t * theta_i, theta_i = base^(-2i/d_head). */
      rope(cfg) {
        const half = cfg.dHead / 2;
        const theta = new Float64Array(half);
        for (let i = 0; i < half; i++) theta[i] = Math.pow(cfg.base, -((2 * i) / cfg.dHead));
        let cos = new Float64Array(0), sin = new Float64Array(0), rows = 0;
        function ensure(need) {  // cos/sin of t * theta_i for t < need, grown on demand (doubling)
          if (need <= rows) return;
          const n = Math.max(need, 2 * rows, 64);
          const c = new Float64Array(n * half), s = new Float64Array(n * half);
          c.set(cos); s.set(sin);
          for (let t = rows; t < n; t++) {
            for (let i = 0; i < half; i++) {
              const angle = t * theta[i];
              c[t * half + i] = Math.cos(angle);
              s[t * half + i] = Math.sin(angle);
            }
          }
          cos = c; sin = s; rows = n;
        }
        /** dst[dOff..] = R_t src[sOff..] (inverse: R_t^T, for the gradient). */
        function rotate(src, sOff, dst, dOff, t, inverse) {
          if (t >= rows) ensure(t + 1);
          const o = t * half;
          for (let i = 0; i < half; i++) {
            const c = cos[o + i], s = sin[o + i];
            const x1 = src[sOff + i], x2 = src[sOff + i + half];
            if (inverse) {
              dst[dOff + i] = x1 * c + x2 * s;
              dst[dOff + i + half] = x2 * c - x1 * s;
            } else {
              dst[dOff + i] = x1 * c - x2 * s;
              dst[dOff + i + half] = x1 * s + x2 * c;
            }
          }
        }
        return { name: "rope", theta, rotate, ensure };
      },
      /** ALiBi with one head: slope 2^-8 times the relative position D = j - i (<= 0). */
      alibi() { const slope = Math.pow(2, -8); return { name: "alibi", bias: (D) => slope * D }; },
    };

    // ------------------------------------------------------------------ the head
    const PARAM_NAMES = ["embed", "u", "w_q", "w_k", "w_v", "w_o", "table"];

    // ------------------------------------------------------------------ inputs, checked at the edge
    // What the trainer cannot train is refused here, naming the setting, its value and what is allowed
    // (the panel shows the message), never trained into a NaN, a wrapped token id or an untrained head.
    const MAX_VOCAB = 65535;  // token ids 0 .. V (the query token) are stored in at most 32-bit integer arrays

    function checkInt(name, value, min, max) {
      if (typeof value !== "number" || !Number.isInteger(value)) {
        throw new Error(`${name} must be a whole number; got ${value}`);
      }
      if (value < min || (max !== undefined && value > max)) {
        throw new Error(`${name} must be ${max === undefined ? `>= ${min}` : `in [${min}, ${max}]`}; got ${value}`);
      }
      return value;
    }

    function checkReal(name, value, min, allowMin) {
      if (typeof value !== "number" || !Number.isFinite(value) || value < min || (value === min && !allowMin)) {
        throw new Error(`${name} must be a finite number ${allowMin ? ">=" : ">"} ${min}; got ${value}`);
      }
      return value;
    }

    /** Token ids 0 .. V (V the query token) for n tokens: bytes while they fit, 32-bit integers beyond. */
    function tokenArray(V, n) { return V <= 255 ? new Uint8Array(n) : new Int32Array(n); }

    function headConfig(cfg) {
      const c = {
        vocab: cfg.vocab ?? 16, dModel: cfg.dModel ?? 32, dHead: cfg.dHead ?? 16,
        pe: cfg.pe ?? "rope", base: cfg.base ?? 10000, maxLen: cfg.maxLen ?? 256,
      };
      checkInt("vocab", c.vocab, 2, MAX_VOCAB);
      checkInt("d_model", c.dModel, 1);
      checkInt("d_head", c.dHead, 1);
      checkInt("max_len", c.maxLen, 1);
      if (!(typeof c.base === "number" && Number.isFinite(c.base) && c.base > 1)) {
        throw new Error(`the RoPE base must be a finite number > 1; got ${c.base}`);
      }
      if (!(c.pe in ENCODINGS)) throw new Error(`unknown encoding ${c.pe}`);
      if (c.pe === "rope" && c.dHead % 2) throw new Error(`RoPE needs an even d_head; got ${c.dHead}`);
      return c;
    }

    function paramShapes(c) {
      const shapes = {
        embed: [c.vocab + 1, c.dModel], u: [c.dModel], w_q: [c.dHead, c.dModel], w_k: [c.dHead, c.dModel],
        w_v: [c.dHead, c.dModel], w_o: [c.vocab, c.dHead],
      };
      if (c.pe === "ape") shapes.table = [c.maxLen, c.dModel];
      return shapes;
    }

    function size(shape) { return shape.reduce((a, b) => a * b, 1); }

    /** A head whose parameters are given (float64 arrays by name, e.g. exported from Python). */
    function headFromParams(cfg, params) {
      const c = headConfig(cfg);
      const p = {};
      for (const [name, shape] of Object.entries(paramShapes(c))) {
        const src = params[name];
        if (!src || src.length !== size(shape)) {
          throw new Error(`parameter ${name} must hold ${size(shape)} numbers; got ${src ? src.length : "none"}`);
        }
        p[name] = Float64Array.from(src);
      }
      return { cfg: c, enc: ENCODINGS[c.pe](c), p, V: c.vocab, dm: c.dModel, dh: c.dHead };
    }

    /** A head initialised as the package does, from seed `seed`: embed, u ~ N(0, 1);
     * W_Q, W_K, W_V ~ N(0, 1/d_model); W_O ~ N(0, 1/d_head); APE rows ~ N(0, 0.02^2). */
    function initHead(cfg, seed) {
      const c = headConfig(cfg);
      const rng = makeRng(seed, STREAM.init);
      const stds = {
        embed: 1, u: 1, w_q: 1 / Math.sqrt(c.dModel), w_k: 1 / Math.sqrt(c.dModel),
        w_v: 1 / Math.sqrt(c.dModel), w_o: 1 / Math.sqrt(c.dHead), table: 0.02,
      };
      const params = {};
      for (const [name, shape] of Object.entries(paramShapes(c))) {
        const a = new Float64Array(size(shape));
        for (let i = 0; i < a.length; i++) a[i] = rng.normal() * stds[name];
        params[name] = a;
      }
      return headFromParams(c, params);
    }

    /** Buffers for sequences of up to `maxL` tokens (reused across steps). */
    function makeWork(h, maxL) {
      const F = Float64Array, V = h.V, Vp = V + 1, dm = h.dm, dh = h.dh;
      return {
        maxL, X: new F(maxL * dm), qpre: new F(dh), q: new F(dh), qs: new F(dh), kpre: new F(maxL * dh),
        K: new F(maxL * dh), s: new F(maxL), a: new F(maxL), da: new F(maxL), ds: new F(maxL),
        A: new F(Vp * dh), T: new F(Vp * V), dT: new F(Vp * V), dA: new F(Vp * dh), lg: new F(V), g: new F(V),
        dqs: new F(dh), dq: new F(dh), dqpre: new F(dh), dk: new F(dh), dkpre: new F(maxL * dh),
        dkSum: new F(dh), dX: new F(maxL * dm), mass: new F(Vp),
      };
    }

    /** y[0..rows) = W x for W [rows, cols] row-major, x at xOff, y at yOff. */
    function matvec(W, rows, cols, x, xOff, y, yOff) {
      for (let r = 0; r < rows; r++) {
        let acc = 0;
        const o = r * cols;
        for (let i = 0; i < cols; i++) acc += W[o + i] * x[xOff + i];
        y[yOff + r] = acc;
      }
    }

    /** The query's logits s_j and attention a_j over keys j = 0 .. L-1 (positions 0 .. L-1), into w. */
    function attend(h, L, w) {
      const { dm, dh, p, enc } = h;
      const scale = 1 / Math.sqrt(dh);
      const perPosition = !!enc.table;  // APE: every position has its own input u + p_t
      if (perPosition) {
        if (L > enc.table.rows) throw new Error(`the APE table has ${enc.table.rows} rows; asked for length ${L}`);
        for (let j = 0; j < L; j++) {
          for (let d = 0; d < dm; d++) w.X[j * dm + d] = p.u[d] + p.table[j * dm + d];
        }
      }
      const X = perPosition ? w.X : p.u;
      const xq = perPosition ? (L - 1) * dm : 0;
      matvec(p.w_q, dh, dm, X, xq, w.qpre, 0);
      if (enc.rotate) enc.rotate(w.qpre, 0, w.q, 0, L - 1, false); else w.q.set(w.qpre);
      for (let i = 0; i < dh; i++) w.qs[i] = w.q[i] * scale;
      if (perPosition) {
        for (let j = 0; j < L; j++) matvec(p.w_k, dh, dm, X, j * dm, w.kpre, j * dh);
      } else {
        matvec(p.w_k, dh, dm, X, 0, w.kpre, 0);
      }
      let mx = -Infinity;
      for (let j = 0; j < L; j++) {
        const ko = j * dh, po = perPosition ? j * dh : 0;
        if (enc.rotate) enc.rotate(w.kpre, po, w.K, ko, j, false);
        else for (let i = 0; i < dh; i++) w.K[ko + i] = w.kpre[po + i];
        let acc = 0;
        for (let i = 0; i < dh; i++) acc += w.qs[i] * w.K[ko + i];
        if (enc.bias) acc += enc.bias(j - (L - 1));
        w.s[j] = acc;
        if (acc > mx) mx = acc;
      }
      let sum = 0;
      for (let j = 0; j < L; j++) { const e = Math.exp(w.s[j] - mx); w.a[j] = e; sum += e; }
      for (let j = 0; j < L; j++) w.a[j] /= sum;
    }

    /** The value table T = (E W_V^T) W_O^T, [V+1, V] (and A = E W_V^T, [V+1, d_head]) into w. */
    function valueTable(h, w) {
      const { V, dm, dh, p } = h, Vp = V + 1;
      for (let t = 0; t < Vp; t++) matvec(p.w_v, dh, dm, p.embed, t * dm, w.A, t * dh);
      for (let t = 0; t < Vp; t++) matvec(p.w_o, V, dh, w.A, t * dh, w.T, t * V);
    }

    function zeroGrads(gr) { for (const k in gr) gr[k].fill(0); }

    function makeGrads(h, trainLen) {
      const gr = {};
      for (const name of Object.keys(h.p)) {
        // APE rows at positions >= the longest training length never get a gradient
        gr[name] = new Float64Array(name === "table" ? trainLen * h.dm : h.p[name].length);
      }
      return gr;
    }

    /**
     * The batch part of the loss: for each sequence b, logits = sum_j a_j T[x_bj], the cross-entropy at
     * the target x_{L-1-k}, and its gradient g_b = (softmax - onehot) / B; accumulated into
     * da_j = sum_b g_b . T[x_bj] and dT[x_bj] += a_j g_b. Returns the summed loss.
     */
    function batchPass(a, T, tokens, off, B, L, V, offset, lg, g, da, dT) {
      for (let j = 0; j < L; j++) da[j] = 0;
      dT.fill(0);
      const invB = 1 / B;
      let lossSum = 0;
      for (let b = 0; b < B; b++) {
        const base = off + b * L;
        for (let c = 0; c < V; c++) lg[c] = 0;
        for (let j = 0; j < L; j++) {
          const aj = a[j], r = tokens[base + j] * V;
          for (let c = 0; c < V; c++) lg[c] += aj * T[r + c];
        }
        const y = tokens[base + L - 1 - offset];
        let mx = -Infinity;
        for (let c = 0; c < V; c++) if (lg[c] > mx) mx = lg[c];
        const ly = lg[y];
        let se = 0;
        for (let c = 0; c < V; c++) { const e = Math.exp(lg[c] - mx); g[c] = e; se += e; }
        lossSum += Math.log(se) - (ly - mx);
        for (let c = 0; c < V; c++) g[c] = (g[c] / se - (c === y ? 1 : 0)) * invB;
        for (let j = 0; j < L; j++) {
          const aj = a[j], r = tokens[base + j] * V;
          let acc = 0;
          for (let c = 0; c < V; c++) { const gc = g[c]; acc += gc * T[r + c]; dT[r + c] += aj * gc; }
          da[j] += acc;
        }
      }
      return lossSum;
    }

    /**
     * batchPass for V = 16, the book's vocabulary, twice as fast: the logits are summed in 16 local
     * variables from aT_j = a_j T (formed once per step), and the backward pass adds each g_b into
     * G_j[x_bj] (one add per entry) before da and dT are read off G once per step:
     * da_j = sum_t T[t] . G_j[t], dT = sum_j a_j G_j. The same numbers as batchPass up to rounding.
     */
    function batchPass16(a, T, tokens, off, B, L, offset, lg, g, da, dT, aT, G) {
      const W = 17 * 16;
      for (let j = 0; j < L; j++) {
        const aj = a[j], o = j * W;
        for (let i = 0; i < W; i++) aT[o + i] = aj * T[i];
      }
      G.fill(0, 0, L * W);
      const invB = 1 / B;
      let lossSum = 0;
      for (let b = 0; b < B; b++) {
        const base = off + b * L;
        let l0 = 0, l1 = 0, l2 = 0, l3 = 0, l4 = 0, l5 = 0, l6 = 0, l7 = 0, l8 = 0, l9 = 0, l10 = 0, l11 = 0, l12 = 0, l13 = 0, l14 = 0, l15 = 0;
        for (let j = 0; j < L; j++) {
          const r = j * W + tokens[base + j] * 16;
            l0 += aT[r + 0]; l1 += aT[r + 1]; l2 += aT[r + 2]; l3 += aT[r + 3];
            l4 += aT[r + 4]; l5 += aT[r + 5]; l6 += aT[r + 6]; l7 += aT[r + 7];
            l8 += aT[r + 8]; l9 += aT[r + 9]; l10 += aT[r + 10]; l11 += aT[r + 11];
            l12 += aT[r + 12]; l13 += aT[r + 13]; l14 += aT[r + 14]; l15 += aT[r + 15];
        }
          lg[0] = l0; lg[1] = l1; lg[2] = l2; lg[3] = l3; lg[4] = l4; lg[5] = l5; lg[6] = l6; lg[7] = l7;
          lg[8] = l8; lg[9] = l9; lg[10] = l10; lg[11] = l11; lg[12] = l12; lg[13] = l13; lg[14] = l14; lg[15] = l15;
        const y = tokens[base + L - 1 - offset];
        let mx = -Infinity;
        for (let c = 0; c < 16; c++) if (lg[c] > mx) mx = lg[c];
        const ly = lg[y];
        let se = 0;
        for (let c = 0; c < 16; c++) { const e = Math.exp(lg[c] - mx); g[c] = e; se += e; }
        lossSum += Math.log(se) - (ly - mx);
        for (let c = 0; c < 16; c++) g[c] = (g[c] / se - (c === y ? 1 : 0)) * invB;
          const g0 = g[0], g1 = g[1], g2 = g[2], g3 = g[3], g4 = g[4], g5 = g[5], g6 = g[6], g7 = g[7];
          const g8 = g[8], g9 = g[9], g10 = g[10], g11 = g[11], g12 = g[12], g13 = g[13], g14 = g[14], g15 = g[15];
        for (let j = 0; j < L; j++) {
          const r = j * W + tokens[base + j] * 16;
            G[r + 0] += g0; G[r + 1] += g1; G[r + 2] += g2; G[r + 3] += g3;
            G[r + 4] += g4; G[r + 5] += g5; G[r + 6] += g6; G[r + 7] += g7;
            G[r + 8] += g8; G[r + 9] += g9; G[r + 10] += g10; G[r + 11] += g11;
            G[r + 12] += g12; G[r + 13] += g13; G[r + 14] += g14; G[r + 15] += g15;
        }
      }
      dT.fill(0);
      for (let j = 0; j < L; j++) {
        const o = j * W, aj = a[j];
        let acc = 0;
        for (let i = 0; i < W; i++) { const x = G[o + i]; acc += T[i] * x; dT[i] += aj * x; }
        da[j] = acc;
      }
      return lossSum;
    }

    /**
     * Mean cross-entropy at the query over a batch and its gradient (added into `gr`).
     * tokens: B sequences of length L (row-major, from `off`), the query token V last.
     * Returns the loss (nats).
     */
    function lossAndGrad(h, w, gr, tokens, off, B, L, offset) {
      const { V, dm, dh, p, enc } = h, Vp = V + 1;
      attend(h, L, w);
      valueTable(h, w);
      const { a, da, dT } = w;
      let lossSum;
      if (V === 16) {
        if (!w.aT || w.aT.length < L * 272) { w.aT = new Float64Array(w.maxL * 272); w.G = new Float64Array(w.maxL * 272); }
        lossSum = batchPass16(w.a, w.T, tokens, off, B, L, offset, w.lg, w.g, w.da, w.dT, w.aT, w.G);
      } else {
        lossSum = batchPass(w.a, w.T, tokens, off, B, L, V, offset, w.lg, w.g, w.da, w.dT);
      }
      // the value table: T = A W_O^T, A = E W_V^T (inner loops run along contiguous rows)
      const { A, dA } = w;
      const gWo = gr.w_o, gWv = gr.w_v, gE = gr.embed, Wo = p.w_o, Wv = p.w_v, E = p.embed;
      dA.fill(0);
      for (let t = 0; t < Vp; t++) {
        const to = t * V, ao = t * dh;
        for (let c = 0; c < V; c++) {
          const x = dT[to + c], co = c * dh;
          for (let i = 0; i < dh; i++) { gWo[co + i] += x * A[ao + i]; dA[ao + i] += x * Wo[co + i]; }
        }
      }
      for (let t = 0; t < Vp; t++) {
        const ao = t * dh, eo = t * dm;
        for (let i = 0; i < dh; i++) {
          const x = dA[ao + i], vo = i * dm;
          for (let d = 0; d < dm; d++) { gWv[vo + d] += x * E[eo + d]; gE[eo + d] += x * Wv[vo + d]; }
        }
      }
      // softmax: ds_j = a_j (da_j - sum_i a_i da_i)
      let ada = 0;
      for (let j = 0; j < L; j++) ada += a[j] * da[j];
      const { ds, dqs, dq, dqpre, dk, dkpre, dkSum, qs, K } = w;
      for (let j = 0; j < L; j++) ds[j] = a[j] * (da[j] - ada);
      // s_j = qs . k_j: dqs = sum_j ds_j k_j, dk_j = ds_j qs
      dqs.fill(0);
      const perPosition = !!enc.table;
      dkSum.fill(0);
      for (let j = 0; j < L; j++) {
        const ko = j * dh, dj = ds[j];
        for (let i = 0; i < dh; i++) { dqs[i] += dj * K[ko + i]; dk[i] = dj * qs[i]; }
        const po = j * dh;
        if (enc.rotate) enc.rotate(dk, 0, dkpre, po, j, true);
        else for (let i = 0; i < dh; i++) dkpre[po + i] = dk[i];
        if (!perPosition) for (let i = 0; i < dh; i++) dkSum[i] += dkpre[po + i];
      }
      const scale = 1 / Math.sqrt(dh);
      for (let i = 0; i < dh; i++) dq[i] = dqs[i] * scale;
      if (enc.rotate) enc.rotate(dq, 0, dqpre, 0, L - 1, true); else dqpre.set(dq);
      // q = W_Q x_{L-1}, k_j = W_K x_j, x_j = u (+ p_j)
      if (perPosition) {
        const { X, dX } = w;
        dX.fill(0, 0, L * dm);
        for (let j = 0; j < L; j++) {
          const po = j * dh, xo = j * dm;
          for (let i = 0; i < dh; i++) {
            const gk = dkpre[po + i], ro = i * dm;
            for (let d = 0; d < dm; d++) { gr.w_k[ro + d] += gk * X[xo + d]; dX[xo + d] += p.w_k[ro + d] * gk; }
          }
        }
        const xo = (L - 1) * dm;
        for (let i = 0; i < dh; i++) {
          const gq = dqpre[i], ro = i * dm;
          for (let d = 0; d < dm; d++) { gr.w_q[ro + d] += gq * X[xo + d]; dX[xo + d] += p.w_q[ro + d] * gq; }
        }
        for (let j = 0; j < L; j++) {
          for (let d = 0; d < dm; d++) { const v = dX[j * dm + d]; gr.u[d] += v; gr.table[j * dm + d] += v; }
        }
      } else {
        for (let i = 0; i < dh; i++) {
          const gk = dkSum[i], gq = dqpre[i], ro = i * dm;
          for (let d = 0; d < dm; d++) {
            gr.w_k[ro + d] += gk * p.u[d];
            gr.w_q[ro + d] += gq * p.u[d];
            gr.u[d] += p.w_k[ro + d] * gk + p.w_q[ro + d] * gq;
          }
        }
      }
      return lossSum / B;
    }

    /**
     * One AdamW step, torch.optim.AdamW's single-tensor update: p *= 1 - lr wd; m = m + (1 - b1)(g - m);
     * v = v b2 + (1 - b2) g g; p += -(lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps).
     * Only the first gr[name].length entries move by the gradient (APE rows never reached keep
     * m = v = 0, for which torch's update is exactly zero); their weight decay is applied later.
     */
    function adamStep(h, gr, state, lr, wd, step) {
      const bc1 = 1 - Math.pow(BETA1, step);
      const bc2 = 1 - Math.pow(BETA2, step);
      const stepSize = lr / bc1, neg = -stepSize;
      const bc2sqrt = Math.sqrt(bc2);
      const decay = 1 - lr * wd;
      const w1 = 1 - BETA1, w2 = 1 - BETA2;
      for (const name in gr) {
        const P = h.p[name], G = gr[name], M = state.m[name], S = state.v[name];
        const n = G.length;
        for (let i = 0; i < n; i++) {
          if (wd !== 0) P[i] *= decay;
          const gi = G[i];
          M[i] = M[i] + w1 * (gi - M[i]);
          S[i] = S[i] * BETA2 + w2 * gi * gi;
          const denom = Math.sqrt(S[i]) / bc2sqrt + EPS;
          P[i] = P[i] + (neg * M[i]) / denom;
        }
      }
    }

    /** Fill B sequences of length L: content tokens uniform over 0 .. V-1, the query token V last. */
    function sampleTokens(rng, out, B, L, V) {
      for (let b = 0; b < B; b++) {
        const o = b * L;
        for (let j = 0; j < L - 1; j++) out[o + j] = rng.int(V);
        out[o + L - 1] = V;
      }
    }

    function checkTask(offset, trainLen, minLen) {
      checkInt("offset", offset, 1);
      checkInt("train_len", trainLen, 1);
      checkInt("the shortest training length", minLen, 1);
      if (trainLen < offset + 2) {
        throw new Error(`offset k = ${offset} needs training sequences of at least k + 2 = ${offset + 2} tokens; ` +
                        `the training length is ${trainLen}`);
      }
      if (minLen < offset + 2 || minLen > trainLen) {
        throw new Error(`the shortest training length must lie in [k + 2, train_len] = [${offset + 2}, ${trainLen}]; ` +
                        `got ${minLen}`);
      }
    }

    /**
     * Train heads on the fixed-offset retrieval task, every head on the same data stream.
     * opts: steps, batchSize, lr, weightDecay, trainLen, minTrainLen (default offset + 2), offset,
     * dataSeed; or `batches`, a list of {L, tokens} used in place of the stream (the tests).
     * Each step draws one length uniform in [minTrainLen, trainLen] and B sequences of it.
     * Returns the losses [steps, heads] (Float64Array, row-major).
     */
    function train(heads, opts, onProgress) {
      const steps = opts.batches ? opts.batches.length : opts.steps;
      const offset = opts.offset, trainLen = opts.trainLen;
      const minLen = opts.minTrainLen ?? offset + 2;
      const lr = opts.lr ?? 1e-2, wd = opts.weightDecay ?? 0;
      checkTask(offset, trainLen, minLen);
      if (!opts.batches) checkInt("steps", steps, 1);
      else if (steps < 1) throw new Error("batches must hold at least one batch");
      checkReal("lr", lr, 0, false);
      checkReal("weight_decay", wd, 0, true);
      const V = heads[0].V;
      const B = opts.batches ? 1 : checkInt("batch_size", opts.batchSize, 1);
      const rng = makeRng(opts.dataSeed ?? 0, STREAM.data);
      const tokens = new Int32Array(B * trainLen);
      const M = heads.length;
      const losses = new Float64Array(steps * M);
      const work = heads.map((h) => makeWork(h, trainLen));
      const grads = heads.map((h) => makeGrads(h, trainLen));
      const states = grads.map((gr) => {
        const m = {}, v = {};
        for (const k in gr) { m[k] = new Float64Array(gr[k].length); v[k] = new Float64Array(gr[k].length); }
        return { m, v };
      });
      for (let step = 1; step <= steps; step++) {
        let L, tok, nb = B;
        if (opts.batches) {
          const batch = opts.batches[step - 1];
          L = batch.L; tok = batch.tokens; nb = tok.length / L;
          if (L > trainLen || L < minLen) throw new Error(`batch ${step - 1} has length ${L} outside [${minLen}, ${trainLen}]`);
        } else {
          L = minLen + rng.int(trainLen - minLen + 1);
          sampleTokens(rng, tokens, B, L, V);
          tok = tokens;
        }
        for (let m = 0; m < M; m++) {
          zeroGrads(grads[m]);
          const loss = lossAndGrad(heads[m], work[m], grads[m], tok, 0, nb, L, offset);
          losses[(step - 1) * M + m] = loss;
          adamStep(heads[m], grads[m], states[m], lr, wd, step);
        }
        if (onProgress && (step % 25 === 0 || step === steps)) onProgress(step, steps);
      }
      if (wd !== 0) {  // the decay of APE rows no training sequence reaches, step by step as torch applies it
        const decay = 1 - lr * wd;
        for (const h of heads) {
          if (!h.p.table) continue;
          const P = h.p.table;
          for (let i = trainLen * h.dm; i < P.length; i++) {
            let x = P[i];
            for (let s = 0; s < steps; s++) x *= decay;
            P[i] = x;
          }
        }
      }
      return losses;
    }

    // ------------------------------------------------------------------ evaluation
    /** Correct answers of head h on n sequences of length L (tokens row-major, the query last). */
    function correctOnTokens(h, tokens, n, L, offset) {
      const w = makeWork(h, L);
      attend(h, L, w);
      valueTable(h, w);
      const { a, T, lg, mass } = w, V = h.V, Vp = V + 1;
      const useMass = L > Vp;
      let correct = 0;
      for (let b = 0; b < n; b++) {
        const base = b * L;
        lg.fill(0);
        if (useMass) {  // attention mass per token id, then mass . T: (V+1) V operations instead of L V
          mass.fill(0);
          for (let j = 0; j < L; j++) mass[tokens[base + j]] += a[j];
          for (let t = 0; t < Vp; t++) {
            const mt = mass[t];
            if (mt === 0) continue;
            const r = t * V;
            for (let c = 0; c < V; c++) lg[c] += mt * T[r + c];
          }
        } else {
          for (let j = 0; j < L; j++) {
            const aj = a[j], r = tokens[base + j] * V;
            for (let c = 0; c < V; c++) lg[c] += aj * T[r + c];
          }
        }
        let best = 0;
        for (let c = 1; c < V; c++) if (lg[c] > lg[best]) best = c;  // the first maximum, as torch.argmax
        if (best === tokens[base + L - 1 - offset]) correct++;
      }
      return correct;
    }

    /** Accuracy [heads][lengths] on n fresh sequences per length, shared by every head. */
    function accuracyByLength(heads, offset, lengths, n, seed) {
      const rng = makeRng(seed ?? 12345, STREAM.eval);
      const V = heads[0].V;
      const out = heads.map(() => new Array(lengths.length).fill(0));
      checkInt("offset", offset, 1);
      checkInt("samples", n, 1);
      if (!Array.isArray(lengths) || lengths.length === 0) throw new Error(`lengths must be a non-empty list; got ${lengths}`);
      lengths.forEach((L) => checkInt("length", L, offset + 2));
      lengths.forEach((L, li) => {
        const tokens = tokenArray(V, n * L);
        sampleTokens(rng, tokens, n, L, V);
        heads.forEach((h, m) => { out[m][li] = correctOnTokens(h, tokens, n, L, offset) / n; });
      });
      return out;
    }

    // ------------------------------------------------------------------ the offset kernel (RoPE)
    /** Amplitude r_i and phase phi_i of each pair: s(D) = sum_i r_i cos(theta_i D - phi_i). */
    function carrierSpectrum(h) {
      if (h.enc.name !== "rope") throw new Error("the offset kernel needs a RoPE head");
      const { dm, dh, p } = h, half = dh / 2;
      const q0 = new Float64Array(dh), k0 = new Float64Array(dh);
      matvec(p.w_q, dh, dm, p.u, 0, q0, 0);
      matvec(p.w_k, dh, dm, p.u, 0, k0, 0);
      const r = new Float64Array(half), phi = new Float64Array(half), sq = Math.sqrt(dh);
      for (let i = 0; i < half; i++) {  // zq conj(zk) / sqrt(d_head), z = x_i + 1j x_{i + d/2}
        const qa = q0[i], qb = q0[i + half], ka = k0[i], kb = k0[i + half];
        const re = (qa * ka + qb * kb) / sq, im = (qb * ka - qa * kb) / sq;
        r[i] = Math.hypot(re, im);
        phi[i] = Math.atan2(im, re);
      }
      return { theta: Float64Array.from(h.enc.theta), r, phi };
    }

    function kernelAt(spec, D) {
      let s = 0;
      for (let i = 0; i < spec.r.length; i++) s += spec.r[i] * Math.cos(spec.theta[i] * D - spec.phi[i]);
      return s;
    }

    /** s(D) for D = -(n-1) .. 0 (the row layout of lengthgen_utils.kernel). */
    function offsetKernel(h, n) {
      const spec = carrierSpectrum(h);
      const out = new Float64Array(n);
      for (let j = 0; j < n; j++) out[j] = kernelAt(spec, j - (n - 1));
      return out;
    }

    /** Each pair's population std over the window D = -(L-1) .. 0. */
    function variationWeights(spec, trainLen) {
      const P = spec.r.length, out = new Float64Array(P);
      for (let i = 0; i < P; i++) {
        let mean = 0;
        const vals = new Float64Array(trainLen);
        for (let j = 0; j < trainLen; j++) {
          const D = j - (trainLen - 1);
          vals[j] = spec.r[i] * Math.cos(spec.theta[i] * D - spec.phi[i]);
          mean += vals[j];
        }
        mean /= trainLen;
        let v = 0;
        for (let j = 0; j < trainLen; j++) v += (vals[j] - mean) * (vals[j] - mean);
        out[i] = Math.sqrt(v / trainLen);
      }
      return out;
    }

    /** Lags 1 .. maxLag at which every pair of `pairs` is within `tol` rad of a whole turn. */
    function pairRecurrences(theta, pairs, maxLag, tol) {
      const out = [];
      const twoPi = 2 * Math.PI;
      for (let lag = 1; lag <= maxLag; lag++) {
        let ok = true;
        for (const i of pairs) {
          const x = theta[i] * lag + Math.PI;
          const err = x - twoPi * Math.floor(x / twoPi) - Math.PI;
          if (Math.abs(err) > tol) { ok = false; break; }
        }
        if (ok) out.push(lag);
      }
      return out;
    }

    /**
     * What chapter 4 reads off a RoPE head's kernel, for offset k and training length L:
     * rel[d-1] = s(-d) - s(-k) for d = 1 .. maxDistance; the dominant pairs (largest variation over
     * the window); their recurrence lags and the candidate distances d = k + lag >= L; the predicted
     * first alias (the first candidate within `tolerance` nats of the target) and the scanned one
     * (the first d >= L within it) (kernel.predicted_alias_distance, kernel.first_alias_distance).
     */
    function kernelReport(h, offset, trainLen, maxDistance, nPairs, phaseTolerance, tolerance) {
      const spec = carrierSpectrum(h);
      const target = kernelAt(spec, -offset);
      const rel = new Float64Array(maxDistance);
      for (let d = 1; d <= maxDistance; d++) rel[d - 1] = kernelAt(spec, -d) - target;
      const variation = variationWeights(spec, trainLen);
      const order = Array.from(variation.keys()).sort((x, y) => variation[y] - variation[x] || x - y);
      const dominant = order.slice(0, Math.min(nPairs, order.length));
      const lags = pairRecurrences(spec.theta, dominant, maxDistance - offset, phaseTolerance);
      const candidates = lags.map((lag) => lag + offset).filter((d) => d >= trainLen);
      let predicted = null;
      for (const d of candidates) {
        if (kernelAt(spec, -d) >= target - tolerance) { predicted = d; break; }
      }
      let scanned = null;
      for (let d = trainLen; d <= maxDistance; d++) {
        if (kernelAt(spec, -d) >= target - tolerance) { scanned = d; break; }
      }
      return { rel, dominant, candidates, predicted, scanned, r: Array.from(spec.r), phi: Array.from(spec.phi) };
    }

    // ------------------------------------------------------------------ a panel's job
    /**
     * Train and measure the heads of job.models ({pe, seed}) as a panel needs:
     * job.head (sizes, base, maxLen), job.train (see train), job.eval ({lengths, samples, seed}),
     * job.kernel ({maxDistance, nPairs, phaseTolerance, tolerance}, RoPE heads only).
     */
    function runJob(job, onProgress) {
      const t0 = (typeof performance !== "undefined" ? performance : Date).now();
      const heads = job.models.map((m) => initHead({ ...job.head, pe: m.pe }, m.seed));
      const losses = train(heads, job.train, onProgress);
      const M = heads.length, steps = losses.length / M;
      const results = heads.map((h, m) => {
        const out = { pe: job.models[m].pe, seed: job.models[m].seed, finalLoss: losses[(steps - 1) * M + m] };
        let finite = true;
        for (let s = 0; s < steps; s++) if (!Number.isFinite(losses[s * M + m])) { finite = false; break; }
        out.finite = finite;
        return out;
      });
      if (job.eval) {
        const acc = accuracyByLength(heads, job.train.offset, job.eval.lengths, job.eval.samples, job.eval.seed);
        acc.forEach((row, m) => { results[m].accuracy = row; });
      }
      if (job.kernel) {
        heads.forEach((h, m) => {
          if (h.enc.name !== "rope") return;
          const k = job.kernel;
          results[m].kernel = kernelReport(h, job.train.offset, job.train.trainLen, k.maxDistance, k.nPairs,
                                           k.phaseTolerance, k.tolerance);
        });
      }
      const t1 = (typeof performance !== "undefined" ? performance : Date).now();
      return { results, ms: t1 - t0 };
    }

    const core = {
      makeRng, ENCODINGS, PARAM_NAMES, headConfig, paramShapes, headFromParams, initHead, makeWork, attend,
      valueTable, lossAndGrad, adamStep, train, sampleTokens, correctOnTokens, accuracyByLength,
      carrierSpectrum, kernelAt, offsetKernel, variationWeights, pairRecurrences, kernelReport, runJob,
    };
    scope.LengthgenCore = core;

    if (typeof scope.WorkerGlobalScope !== "undefined" && scope instanceof scope.WorkerGlobalScope) {
      scope.onmessage = (event) => {
        const { id, job } = event.data;
        try {
          let last = 0;
          const out = runJob(job, (done, total) => {
            const now = Date.now();
            if (now - last > 80 || done === total) { last = now; scope.postMessage({ type: "progress", id, done, total }); }
          });
          scope.postMessage({ type: "result", id, ...out });
        } catch (err) {
          scope.postMessage({ type: "error", id, message: String((err && err.message) || err) });
        }
      };
    }
    return core;
  }

  const core = lengthgenCore(typeof window !== "undefined" ? window : globalThis);
  if (typeof window === "undefined" || typeof document === "undefined") return;

  // ==============================================================================================
  // 2. The panels.
  // ==============================================================================================
  let workerUrl = null;

  /** A Worker running lengthgenCore, started from a Blob of its source text (works from file://). */
  function newWorker() {
    if (!workerUrl) {
      const text = "(" + lengthgenCore.toString() + ")(self);";
      workerUrl = URL.createObjectURL(new Blob([text], { type: "text/javascript" }));
    }
    return new Worker(workerUrl);
  }

  /** Split a job's models over up to `n` workers; resolve with every model's result, in order. */
  function runParallel(job, nWorkers, onProgress) {
    const parts = [];
    const n = Math.max(1, Math.min(nWorkers, job.models.length));
    for (let i = 0; i < n; i++) parts.push([]);
    job.models.forEach((m, i) => parts[i % n].push(i));
    const done = new Array(n).fill(0);
    const totals = parts.map((idx) => idx.length * job.train.steps);
    const workers = [];
    const promise = new Promise((resolve, reject) => {
      const results = new Array(job.models.length);
      let remaining = n;
      parts.forEach((idx, i) => {
        const worker = newWorker();
        workers.push(worker);
        worker.onmessage = (event) => {
          const msg = event.data;
          if (msg.type === "progress") {
            done[i] = msg.done * idx.length;
            onProgress(done.reduce((a, b) => a + b, 0) / totals.reduce((a, b) => a + b, 0));
          } else if (msg.type === "result") {
            msg.results.forEach((r, j) => { results[idx[j]] = r; });
            worker.terminate();
            if (--remaining === 0) resolve(results);
          } else if (msg.type === "error") {
            workers.forEach((w) => w.terminate());
            reject(new Error(msg.message));
          }
        };
        worker.onerror = (event) => {
          event.preventDefault();
          workers.forEach((w) => w.terminate());
          reject(new Error(event.message || "the training worker failed"));
        };
        worker.postMessage({ id: i, job: { ...job, models: idx.map((j) => job.models[j]) } });
      });
    });
    return { promise, cancel: () => workers.forEach((w) => w.terminate()) };
  }

  // ------------------------------------------------------------------ figures (the look of lengthgen_utils.plots)
  function wrapText(text, width) {
    if (!text) return text;
    const lines = [];
    for (const segment of String(text).split("<br>")) {
      const words = segment.split(/\s+/).filter((w) => w.length);
      if (!words.length) { lines.push(""); continue; }
      let line = words[0];
      for (const w of words.slice(1)) {
        if (line.length + 1 + w.length <= width) line += " " + w;
        else { lines.push(line); line = w; }
      }
      lines.push(line);
    }
    return lines.join("<br>");
  }

  function nLines(text) { return text ? String(text).split("<br>").length : 0; }

  function rgba(hex, alpha) {
    const h = hex.replace("#", "");
    const [r, g, b] = [0, 2, 4].map((i) => parseInt(h.slice(i, i + 2), 16));
    return `rgba(${r},${g},${b},${alpha})`;
  }

  /** The title, legend and height rules of plots.fit_to_column (the constants come from Python). */
  function fitToColumn(fig, fit) {
    const layout = fig.layout;
    layout.title = { ...(layout.title || {}), text: wrapText(layout.title.text, fit.title_chars) };
    for (const t of fig.data) if (t.name && t.showlegend !== false) t.name = wrapText(t.name, fit.legend_chars);
    const top = fit.toolbar_px + Math.max(nLines(layout.title.text) - 1, 0) * fit.title_line_px + 16;
    layout.margin = { ...(layout.margin || {}), t: top };
    const entries = new Set(fig.data.filter((t) => t.showlegend !== false && t.name).map((t) => t.legendgroup || t.name));
    const named = (layout.shapes || []).filter((s) => s.showlegend && s.name);  // reference lines in the legend
    for (const s of named) { s.name = wrapText(s.name, fit.legend_chars); entries.add(s.legendgroup || s.name); }
    const legendPx = layout.showlegend === false ? 0 : fit.legend_line_px * Math.max(0, entries.size - 1);
    layout.height = fit.figure_height + top - (fit.toolbar_px + 16) + legendPx;
    for (const key of Object.keys(layout)) {
      if (/^[xy]axis/.test(key) && layout[key] && layout[key].title && layout[key].title.text) {
        layout[key].title.text = wrapText(layout[key].title.text, key[0] === "x" ? fit.x_title_chars : fit.y_title_chars);
      }
    }
    return fig;
  }

  function seedNote(title, nSeeds, minSeeds) {
    if (nSeeds >= minSeeds) return title;
    const said = `${nSeeds} seed${nSeeds !== 1 ? "s" : ""}`;  // plots.seed_note's rule
    const pattern = new RegExp(`(?<![\\d.])${said}\\b`);
    return pattern.test(title) ? title.replace(pattern, `${said} (fewer than ${minSeeds})`)
      : `${title} (${said}: fewer than ${minSeeds})`;
  }

  /** Accuracy against length, mean over seeds with a min..max band (plots.accuracy_vs_length). */
  function accuracyFigure(curves, chance, chanceText, trainLen, title, base, fit) {
    const data = [];
    const all = new Set();
    let fewest = Infinity;
    for (const c of curves) {
      const x = c.lengths.map((L) => Math.log2(L));
      c.lengths.forEach((L) => all.add(L));
      const n = c.accuracy.length;
      fewest = Math.min(fewest, n);
      const cols = c.lengths.map((_, i) => c.accuracy.map((row) => row[i]));
      const lo = cols.map((v) => Math.min(...v)), hi = cols.map((v) => Math.max(...v));
      const mean = cols.map((v) => v.reduce((a, b) => a + b, 0) / v.length);
      data.push({ type: "scatter", x: x.concat(x.slice().reverse()), y: hi.concat(lo.slice().reverse()), mode: "lines",
                  fill: "toself", fillcolor: rgba(c.color, 0.18), line: { width: 0 }, hoverinfo: "skip",
                  showlegend: false, legendgroup: c.label });
      data.push({ type: "scatter", x, y: mean, mode: "lines+markers", name: `${c.label} (mean of ${n})`,
                  line: { color: c.color, width: 3, dash: "solid" }, legendgroup: c.label,
                  customdata: c.lengths.map((L, i) => [L, lo[i], hi[i]]),
                  hovertemplate: "L=%{customdata[0]:d}: mean %{y:.3f} (min %{customdata[1]:.3f}, max %{customdata[2]:.3f})" });
    }
    const ticks = Array.from(all).sort((a, b) => a - b);
    const tx = ticks.map((L) => Math.log2(L));
    const layout = JSON.parse(JSON.stringify(base));
    layout.title = { ...(layout.title || {}), text: seedNote(title, fewest, fit.min_seeds) };
    layout.xaxis = { ...(layout.xaxis || {}), tickvals: tx, ticktext: ticks.map((L) => `${L}<br>${L / trainLen}x`),
                     range: [tx[0] - 0.3, tx[tx.length - 1] + 0.3], autorange: false };
    // reference lines named in the legend, never written over the curves (plots.accuracy_vs_length)
    layout.shapes = [
      { line: { color: "black", dash: "dot", width: 1.5 }, name: chanceText, showlegend: true, type: "line",
        x0: 0, x1: 1, xref: "x domain", y0: chance, y1: chance, yref: "y" },
      { line: { color: "gray", dash: "dash", width: 1 }, name: "training length", showlegend: true, type: "line",
        x0: Math.log2(trainLen), x1: Math.log2(trainLen), xref: "x", y0: 0, y1: 1, yref: "y domain" },
    ];
    layout.annotations = [];
    return fitToColumn({ data, layout }, fit);
  }

  const SEED_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"];

  /** The kernel over a long range with its aliases: the traces of plots.alias_kernel_figure (axes, lines
   * and their labels, which do not depend on the setting, come with the static figure's layout). */
  function kernelFigure(d, base, fit) {
    const data = [];
    const dist = Array.from({ length: d.maxDistance }, (_, i) => i + 1);
    const top = d.yHigh;
    d.seeds.forEach((s, i) => {
      const color = SEED_COLORS[i % SEED_COLORS.length];
      const saidAlias = s.alias === null ? "no alias" : `alias ${s.alias}`;
      const saidFail = s.fail === null ? `holds to ${d.longestTested}` : `fails at L = ${s.fail}`;
      data.push({ type: "scatter", x: dist, y: Array.from(s.rel), mode: "lines",
                  name: `seed ${i}: ${saidAlias}, ${saidFail}`, line: { color, width: 1.2 },
                  legendgroup: `seed${i}`, hovertemplate: "d=%{x}: %{y:.2f} nats<extra></extra>" });
      if (s.alias !== null) {
        data.push({ type: "scatter", x: [s.alias], y: [Math.min(s.rel[s.alias - 1], top - 1)], mode: "markers",
                    showlegend: false,
                    legendgroup: `seed${i}`, marker: { color, size: 11, symbol: "circle-open", line: { width: 2.5 } },
                    hovertemplate: `first alias: d=${s.alias}<extra></extra>` });
      }
      if (s.fail !== null) {
        data.push({ type: "scatter", x: [s.fail - 1], y: [top - 0.4], mode: "markers", showlegend: false,
                    legendgroup: `seed${i}`, marker: { color, size: 12, symbol: "x-thin", line: { width: 3, color } },
                    hovertemplate: `accuracy < 0.95 from L=${s.fail}<extra></extra>` });
      }
    });
    data.push({ type: "scatter", x: d.candidates, y: d.candidates.map(() => d.yLow + 0.5), mode: "markers",
                name: `candidate aliases (pairs ${d.pairs.join(", ")} recur)`,
                marker: { color: "#555", size: 9, symbol: "line-ns-open", line: { width: 1 } },
                hovertemplate: "candidate d=%{x}<extra></extra>" });
    const layout = JSON.parse(JSON.stringify(base));
    layout.title = { ...(layout.title || {}), text: d.title };
    layout.yaxis = { ...(layout.yaxis || {}), range: [d.yLow, top], autorange: false };
    return fitToColumn({ data, layout }, fit);
  }

  // ------------------------------------------------------------------ the panel
  const SUPERSCRIPT = "⁰¹²³⁴⁵⁶⁷⁸⁹";

  /** A slider value as the panel writes it (the RoPE base: 10, 17.8, 316, 1.8×10⁴, 10⁵; live._base_text). */
  function fmt(control, value) {
    if (control.format === "base") {
      if (value >= 1000) {
        const e = Math.floor(Math.log10(value) + 1e-9), m = value / Math.pow(10, e);
        const power = "10" + String(e).split("").map((c) => SUPERSCRIPT[Number(c)]).join("");
        return (Math.abs(m - 1) < 1e-9 ? "" : `${m.toPrecision(2)}×`) + power;
      }
      return value >= 100 ? String(Math.round(value)) : String(Number(value.toPrecision(3)));
    }
    return String(value);
  }

  class LivePanel {
    constructor(root) {
      this.root = root;
      this.config = JSON.parse(root.querySelector("script.lg-live-config").textContent);
      this.gd = root.querySelector(".lg-live-figure .plotly-graph-div");
      this.status = root.querySelector(".lg-live-status");
      this.cache = new Map();
      this.job = null;
      this.timer = null;
      this.values = { ...this.config.initial };
      this.staticFigure = null;
      this.build();
    }

    key(values) { return JSON.stringify(this.config.controls.map((c) => values[c.name])); }

    build() {
      const box = document.createElement("div");
      box.className = "lg-live-controls";
      this.inputs = {};
      for (const c of this.config.controls) {
        const row = document.createElement("label");
        row.className = "lg-live-control";
        const name = document.createElement("span");
        name.className = "lg-live-name";
        name.innerHTML = c.label;  // the book's own text (e.g. d<sub>head</sub>)
        const input = document.createElement("input");
        input.type = "range";
        input.min = "0";
        input.max = String(c.values.length - 1);
        input.step = "1";
        input.value = String(Math.max(0, c.values.indexOf(this.values[c.name])));
        input.dataset.name = c.name;
        input.setAttribute("aria-label", name.textContent);
        const out = document.createElement("output");
        out.className = "lg-live-value";
        const show = () => {
          const v = c.values[Number(input.value)];
          out.textContent = fmt(c, v);
          input.setAttribute("aria-valuetext", fmt(c, v));
        };
        show();
        input.addEventListener("input", () => { show(); this.changed(c.name, c.values[Number(input.value)], 450); });
        input.addEventListener("change", () => { show(); this.changed(c.name, c.values[Number(input.value)], 60); });
        row.append(name, input, out);
        box.append(row);
        this.inputs[c.name] = input;
      }
      const progress = document.createElement("progress");
      progress.className = "lg-live-progress";
      progress.max = 1;
      progress.value = 0;
      progress.hidden = true;
      this.progress = progress;
      this.root.querySelector(".lg-live-figure").before(box);
      this.status.before(progress);
      this.root.classList.add("lg-live-ready");
      this.say(this.config.text.ready, "static");
    }

    say(text, state) {
      this.status.textContent = text;
      this.root.dataset.state = state;
    }

    changed(name, value, delay) {
      this.values[name] = value;
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.update(), delay);
    }

    invalid(values) {
      for (const rule of this.config.rules || []) {
        if (rule.kind === "offset_fits" && values[rule.offset] > values[rule.train_len] - 2) {
          const k = values[rule.offset], L = values[rule.train_len];
          return `No task for this setting: the offset k = ${k} needs training sequences of at least k + 2 = ${k + 2} ` +
                 `tokens, and the training length is ${L}. Lower the offset to ${L - 2} or less, or raise the ` +
                 `training length to ${k + 2} or more.`;
        }
      }
      return null;
    }

    update() {
      const values = { ...this.values };
      const key = this.key(values);
      if (this.job) { this.job.cancel(); this.job = null; }
      this.progress.hidden = true;
      const problem = this.invalid(values);
      if (problem) {
        this.root.classList.add("lg-live-stale");
        this.say(problem, "invalid");
        return;
      }
      if (key === this.key(this.config.initial)) {
        if (this.staticFigure) this.draw(this.staticFigure);
        this.say(this.config.text.initial, "static");
        return;
      }
      if (this.cache.has(key)) {
        const hit = this.cache.get(key);
        this.draw(hit.figure);
        this.say(hit.text + " (kept from earlier in this visit)", "done");
        return;
      }
      const job = this.makeJob(values);
      this.root.classList.add("lg-live-stale");
      this.progress.hidden = false;
      this.progress.value = 0;
      const what = this.describe(values);
      this.say(`The page is training: ${what}. 0%`, "training");
      const t0 = performance.now();
      const nWorkers = job.models.length >= 4 ? Math.max(1, Math.min(2, navigator.hardwareConcurrency || 1)) : 1;
      const run = runParallel(job, nWorkers, (f) => {
        this.progress.value = f;
        this.say(`The page is training: ${what}. ${Math.floor(f * 100)}%`, "training");
      });
      this.job = run;
      run.promise.then((results) => {
        if (this.job !== run) return;
        this.job = null;
        const ms = performance.now() - t0;
        this.progress.hidden = true;
        if (results.some((r) => !r.finite)) {
          this.say(`Training diverged (a loss that is not a number) for ${what}; the figure was not redrawn.`, "invalid");
          return;
        }
        const figure = this.figure(values, results);
        this.draw(figure);
        const text = `Trained in this page: ${what}, in ${(ms / 1000).toFixed(1)} s.`;
        this.cache.set(key, { figure, text });
        this.root.dataset.lastRetrainMs = String(Math.round(ms));
        this.root.dataset.retrains = String(Number(this.root.dataset.retrains || 0) + 1);
        this.say(text, "done");
      }, (err) => {
        if (this.job !== run) return;
        this.job = null;
        this.progress.hidden = true;
        this.say(`The retrain failed: ${err.message}`, "invalid");
      });
    }

    draw(figure) {
      this.root.classList.remove("lg-live-stale");
      const config = { responsive: true, displaylogo: false };
      window.Plotly.react(this.gd, JSON.parse(JSON.stringify(figure.data)), JSON.parse(JSON.stringify(figure.layout)), config);
    }

    describe(values) {
      const f = this.config.fixed;
      if (this.config.kind === "accuracy") {
        const n = values.n_seeds;
        return `${f.encodings.map((e) => f.labels[e]).join(" and ")}, ${n} seed${n === 1 ? "" : "s"} each, ` +
               `k = ${values.offset}, training length ${values.train_len}, ${f.steps} steps of ${f.batch_size} sequences`;
      }
      return `RoPE base ${fmt({ format: "base" }, values.base)}, d_head ${values.d_head}, ${f.n_seeds} seeds, ` +
             `k = ${f.offset}, ${f.steps} steps of ${f.batch_size} sequences`;
    }

    makeJob(values) {
      const f = this.config.fixed;
      if (this.config.kind === "accuracy") {
        const T = values.train_len, k = values.offset;
        const lengths = f.multiples.map((m) => m * T);
        const models = [];
        for (const pe of f.encodings) for (let s = 0; s < values.n_seeds; s++) models.push({ pe, seed: s });
        return {
          models,
          head: { vocab: f.vocab_size, dModel: f.d_model, dHead: f.d_head, base: f.base, maxLen: Math.max(...lengths) },
          train: { steps: f.steps, batchSize: f.batch_size, lr: f.lr, weightDecay: f.weight_decay, trainLen: T,
                   minTrainLen: k + 2, offset: k, dataSeed: f.data_seed },
          eval: { lengths, samples: f.eval_samples, seed: f.eval_seed },
        };
      }
      const models = [];
      for (let s = 0; s < f.n_seeds; s++) models.push({ pe: "rope", seed: s });
      return {
        models,
        head: { vocab: f.vocab_size, dModel: f.d_model, dHead: values.d_head, base: values.base, maxLen: 2 },
        train: { steps: f.steps, batchSize: f.batch_size, lr: f.lr, weightDecay: f.weight_decay, trainLen: f.train_len,
                 minTrainLen: f.min_train_len, offset: f.offset, dataSeed: f.data_seed },
        eval: { lengths: f.lengths, samples: f.eval_samples, seed: f.eval_seed },
        kernel: { maxDistance: f.max_distance, nPairs: f.n_pairs, phaseTolerance: f.phase_tolerance,
                  tolerance: f.tolerance },
      };
    }

    figure(values, results) {
      const f = this.config.fixed, fit = this.config.fit, base = this.config.layout;
      if (this.config.kind === "accuracy") {
        const T = values.train_len, lengths = f.multiples.map((m) => m * T);
        const curves = f.encodings.map((pe) => ({
          label: f.labels[pe], color: f.colors[pe], lengths,
          accuracy: results.filter((r) => r.pe === pe).map((r) => r.accuracy),
        }));
        const n = values.n_seeds;
        const title = this.config.text.title.replace("{k}", values.offset).replace("{T}", T)
          .replace("{n} seeds", n === 1 ? "1 seed" : `${n} seeds`);
        return accuracyFigure(curves, f.chance, f.chance_text, T, title, base, fit);
      }
      const seeds = results.map((r) => {
        let fail = null;
        for (let j = 0; j < f.lengths.length; j++) if (r.accuracy[j] < f.fail_below) { fail = f.lengths[j]; break; }
        return { rel: r.kernel.rel, alias: r.kernel.predicted, fail, dominant: r.kernel.dominant,
                 candidates: r.kernel.candidates };
      });
      const candidates = Array.from(new Set(seeds.flatMap((s) => s.candidates))).sort((a, b) => a - b);
      const pairs = Array.from(new Set(seeds.flatMap((s) => s.dominant))).sort((a, b) => a - b);
      const title = this.config.text.title.replace("{base}", fmt({ format: "base" }, values.base))
        .replace("{d_head}", values.d_head);
      return kernelFigure({ maxDistance: f.max_distance, longestTested: f.lengths[f.lengths.length - 1],
                            yLow: f.y_low, yHigh: f.y_high, seeds, candidates, pairs, title }, base, fit);
    }
  }

  function start() {
    const roots = document.querySelectorAll(".lg-live");
    if (!roots.length) return;
    if (!window.Plotly || typeof Worker === "undefined" || typeof Blob === "undefined") {
      roots.forEach((r) => {
        const s = r.querySelector(".lg-live-status");
        if (s) s.textContent += " (This browser cannot run the live version: it needs Web Workers.)";
      });
      return;
    }
    roots.forEach((root) => {
      try {
        const panel = new LivePanel(root);
        root.lengthgenPanel = panel;
        const keep = () => {
          if (panel.gd && panel.gd.data && !panel.staticFigure) {
            panel.staticFigure = JSON.parse(JSON.stringify({ data: panel.gd.data, layout: panel.gd.layout }));
          }
        };
        keep();
        if (!panel.staticFigure) setTimeout(keep, 0);
      } catch (err) {
        const s = root.querySelector(".lg-live-status");
        if (s) s.textContent = `The live version of this panel could not start: ${err.message}`;
      }
    });
  }

  window.LengthgenLive = { core, lengthgenCore, newWorker, runParallel, accuracyFigure, kernelFigure, wrapText, fmt };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
