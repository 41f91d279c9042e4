"""kvsim's bit-exact codecs on arrays (core/codecs.hpp, contract §4).

``encode(fmt, x)``: fp32 values -> codes (uint8; uint16 for bf16/fp16).
Formats: e4m3 and e5m2 (saturating, as ``__nv_cvt_float_to_fp8(.., __NV_SATFINITE, ..)``),
e4m3-nosat, e5m2-nosat, e2m1, int8, bf16, fp16. ``decode(fmt, codes)``:
codes -> exact fp32. ``nvfp4_quantize(x, global_scale)``: (packed bytes,
scale bytes) of 16-element blocks.
"""

import numpy as np

from . import _kvsim
from . import _tensors as T


def _host(x):
    if T.is_torch(x):
        x = x.detach().cpu()
        if T.float8_dtype(x):
            x = x.view(T.torch.uint8)
        elif x.dtype == T.torch.bfloat16:
            x = x.view(T.torch.int16)
        x = x.numpy()
    return np.asarray(x)


def encode(fmt, x):
    return _kvsim.codec_encode(fmt, np.asarray(_host(x), dtype=np.float32))


def decode(fmt, codes):
    c = _host(codes)
    return _kvsim.codec_decode(fmt, c.view(np.uint8 if c.itemsize == 1 else np.uint16).astype(np.uint16))


def nvfp4_quantize(x, global_scale):
    return _kvsim.nvfp4_quantize(np.asarray(_host(x), dtype=np.float32).reshape(-1), float(global_scale))
