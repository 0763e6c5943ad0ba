"""Arrow arrays of numbers and booleans to numpy and back, and of a list of strings, without pyarrow's pandas bridge.

pyarrow converts with ``Array.to_numpy``, ``np.asarray(array)`` and ``pa.array(ndarray)`` through its pandas
layer, which imports pandas on first use: 0.3–0.6 s of a fresh task process that needs no pandas (a step
task's upsert stage paid it in the middle of its work). :func:`numpy_of` and :func:`arrow_of` read and write
the arrays' buffers directly for the types they take, and give exactly what pyarrow's conversions give
(``pa.array`` of a Python list imports pandas too: :func:`strings_of`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa


def numpy_of(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``array.to_numpy(zero_copy_only=False)``: without pandas for integers, floats and booleans with no
    null (numbers zero-copy and read-only, booleans a new array); any other array through pyarrow."""
    import numpy as np
    import pyarrow as pa

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    dtype = _dtype(array.type)
    if dtype is None or array.null_count:
        return array.to_numpy(zero_copy_only=False)
    data = array.buffers()[1]
    if pa.types.is_boolean(array.type):
        if not len(array):
            return np.zeros(0, dtype=np.bool_)
        bits = np.unpackbits(np.frombuffer(data, np.uint8), count=array.offset + len(array), bitorder="little")
        return bits[array.offset :].view(np.bool_)  # 0 and 1: bools as they are
    if not len(array):
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(data, dtype, count=len(array), offset=array.offset * dtype.itemsize)


def arrow_of(values: np.ndarray) -> pa.Array:
    """``pa.array(values)`` for a one-dimensional numpy array of integers, floats or booleans, without pandas
    (numbers share ``values``' memory when it is contiguous)."""
    import numpy as np
    import pyarrow as pa

    if values.ndim != 1 or values.dtype.kind not in "iufb":
        raise TypeError(f"arrow_of takes a 1-d array of numbers or booleans, not {values.dtype} in {values.ndim}-d")
    values = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("="))
    if values.dtype.kind == "b":
        bits = np.packbits(values, bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(bits)])
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])


def strings_of(values: list[str]) -> pa.Array:
    """``pa.array(values, pa.string())`` for a list of strings (no ``None``), without pandas."""
    import numpy as np
    import pyarrow as pa

    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    data = pa.py_buffer(b"".join(encoded))
    return pa.Array.from_buffers(pa.string(), len(encoded), [None, pa.py_buffer(offsets), data])


def _dtype(type_: pa.DataType) -> np.dtype | None:
    import numpy as np
    import pyarrow as pa

    if pa.types.is_boolean(type_):
        return np.dtype(np.bool_)
    if pa.types.is_integer(type_):
        return np.dtype(f"{'u' if pa.types.is_unsigned_integer(type_) else 'i'}{type_.bit_width // 8}")
    if pa.types.is_floating(type_):
        return np.dtype(f"f{type_.bit_width // 8}")
    return None
