"""Device helpers shared by the GDN kernels: the fused gates and the q/k L2 norm."""

import triton
import triton.language as tl

L2_EPS = tl.constexpr(1e-6)  # as Qwen3-Next's in-kernel L2 norm (attngen.families.gdn.reference)
SOFTPLUS_THRESHOLD = tl.constexpr(20.0)  # softplus(x) = x above it, as torch's


@triton.jit
def gate_values(a, b, a_log, dt_bias):
    """(g, beta) in fp32 from the raw gate inputs: g = -exp(A_log) * softplus(a + dt_bias)
    (the log of the step's decay), beta = sigmoid(b)."""
    x = a.to(tl.float32) + dt_bias
    softplus = tl.where(x > SOFTPLUS_THRESHOLD, x, tl.log(1.0 + tl.exp(x)))
    g = -tl.exp(a_log) * softplus
    beta = 1.0 / (1.0 + tl.exp(-b.to(tl.float32)))
    return g, beta


@triton.jit
def l2norm_rows(x, L2NORM: tl.constexpr):
    """Rows of ``x`` (fp32, last axis the head dim) scaled to unit L2 norm when L2NORM."""
    if L2NORM:
        x = x / tl.sqrt(tl.sum(x * x, axis=-1, keep_dims=True) + L2_EPS)
    return x


@triton.jit
def inverse_norms_from_gram(gram, ri, ci, L2NORM: tl.constexpr):
    """1 / sqrt(||x_i||^2 + eps) from the Gram matrix x x^T [rows, rows] (its diagonal)."""
    if L2NORM:
        return 1.0 / tl.sqrt(tl.sum(tl.where(ri == ci, gram, 0.0), axis=1) + L2_EPS)
    else:
        return tl.sum(tl.where(ri == ci, 1.0, 0.0), axis=1)
