"""Plain data between the student's kernel and the grader: a format that cannot carry code.

When a notebook is graded, the checks run in the grader's process and the student's
functions in a sandboxed kernel; what crosses between them is written with :func:`encode`
and read back with :func:`decode`. The format is a JSON header plus raw tensor bytes: no
pickle, nothing is imported or called while reading. :func:`decode` builds only plain
Python values (``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, tuples, lists,
dicts with string keys), plain ``torch.Tensor``\\ s (CPU, or ``meta`` with no data), dtypes,
devices, generators and ``nn.MultiheadAttention`` modules, and it checks every size first.
Whatever sent the bytes (a student's code can replace this module in its own kernel), the
reader gets plain values of exact built-in types, never a subclass that compares "equal" to
everything.

Objects that are not plain data (a module a student's class built, a function) do not
cross: the kernel keeps them and sends a :class:`Handle` (a number), which later requests
can name.

Why not safetensors: it carries a flat map of names to tensors, while a message here nests
containers and carries handles, dtypes, generators, modules and ``meta`` tensors, so the header
would stay this module's to parse (the larger part of what untrusted bytes reach); the tensor
bytes themselves are read in one place (``_Reader.tensor``: a known dtype, a bounded shape, the
size checked against what is left, then ``torch.frombuffer`` of a copy), which a second format
would not make smaller.

What this does not do: judge whether the values are right. That is the checks' job.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import torch

MAGIC = b"AGW1"
#: The largest message either side accepts (header and tensor bytes together).
MAX_BYTES = 512 * 2**20
#: The largest answer the grader reads from a student's kernel: what every check needs, many times over,
#: and small enough that a flood of them cannot starve the grader (it is checked before anything is built).
MAX_REPLY_BYTES = 64 * 2**20
#: The largest JSON header (the values' description) of any message, checked before it is parsed.
MAX_HEADER_BYTES = 4 * 2**20
#: How deeply containers may nest, and how many values one message may hold.
MAX_DEPTH = 32
MAX_VALUES = 100_000

#: What a request from the kernel for a served object (:mod:`autograder.kernel.served`) starts with, as an ``input()``
#: prompt: the grader answers such a prompt with the call's result, any other with an empty line.
SERVED_PROMPT = "autograder-served:"

DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex128, torch.complex64,
              torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
}


class WireError(ValueError):
    """The bytes are not a message of this format (or break one of its limits)."""


@dataclass(frozen=True)
class Handle:
    """An object that stays in the process that made it; ``kind`` describes it for messages."""

    number: int
    kind: str = "object"
    callable: bool = False


@dataclass(frozen=True)
class Served:
    """An object the grader keeps and runs for the kernel (:mod:`autograder.kernel.served`): the kernel gets a stand-in
    whose calls come back to the grader, which counts them."""

    number: int


class Proxy:
    """What stands, on the grader's side, for an object the kernel keeps (:class:`autograder.grader.remote.Remote`).

    Modules that must recognise one (the comparisons, calling a student's function) test for this
    base class, so they need not import the grader's side of the protocol.
    """

    description: str

    def __wire_handle__(self) -> Handle:
        raise NotImplementedError

    def serve(self, obj: Any, methods: tuple[str, ...]) -> Served:
        """``obj`` kept on the grader's side for this object's calls, which may call ``methods`` of it."""
        raise NotImplementedError

    def under(self, forbid: tuple, exercise: str) -> Proxy:
        """This object, whose calls are part of ``exercise`` under the rules ``forbid``."""
        raise NotImplementedError


def _dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise WireError(f"tensors of dtype {dtype} are not supported")
    return name


class _Writer:
    def __init__(self, keep) -> None:
        self.blobs: list[bytes] = []
        self.size = 0
        self.keep = keep

    def blob(self, data: bytes) -> int:
        self.size += len(data)
        if self.size > MAX_BYTES:
            raise WireError(f"the data is larger than {MAX_BYTES} bytes")
        self.blobs.append(data)
        return len(self.blobs) - 1

    def tensor(self, t: torch.Tensor) -> dict:
        info = {"dtype": _dtype_name(t.dtype), "shape": list(t.shape), "device": t.device.type,
                "requires_grad": bool(t.requires_grad)}
        if t.device.type == "meta":
            return {"tensor": info}
        if t.device.type != "cpu":
            raise WireError(f"a tensor on device {t.device}")
        data = t.detach().contiguous().reshape(-1)
        raw = data.view(torch.uint8).numpy().tobytes() if data.numel() else b""
        info["blob"] = self.blob(raw)
        return {"tensor": info}

    def value(self, x: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise WireError(f"containers nested more than {MAX_DEPTH} deep")
        kind = type(x)
        if x is None:
            return None
        if kind is bool:
            return {"bool": x}
        if kind is int:
            return {"int": str(x)}
        if kind is float:
            return {"float": x.hex()}
        if kind is complex:
            return {"complex": [x.real.hex(), x.imag.hex()]}
        if kind is str:
            return {"str": x}
        if kind in (tuple, list):
            return {kind.__name__: [self.value(v, depth + 1) for v in x]}
        if kind is dict and all(type(k) is str for k in x):
            return {"dict": [[k, self.value(v, depth + 1)] for k, v in x.items()]}
        if kind is torch.Tensor or kind is torch.nn.Parameter:
            return self.tensor(x)
        if kind is torch.dtype:
            return {"dtype": _dtype_name(x)}
        if kind is torch.device:
            return {"device": str(x)}
        if kind is torch.Generator:
            return {"generator": self.tensor(x.get_state())["tensor"], "device": x.device.type}
        if kind is torch.nn.MultiheadAttention:
            return {"mha": _mha_spec(x, self)}
        if kind is Handle:
            return {"handle": x.number}
        if kind is Served:
            return {"served": x.number}
        if hasattr(kind, "__wire_served__"):  # the kernel's stand-in for a served object, sent back to the grader
            return {"served": x.__wire_served__().number}
        if hasattr(kind, "__wire_handle__"):  # an object of the other side, sent back to it (a proxy)
            return {"handle": x.__wire_handle__().number}
        if self.keep is not None:
            handle = self.keep(x)
            return {"handle": handle.number, "kind": handle.kind, "callable": handle.callable}
        raise WireError(f"a {kind.__name__} is not plain data")


def _mha_spec(mha: torch.nn.MultiheadAttention, writer: _Writer) -> dict:
    some = next(mha.parameters())
    return {
        "embed_dim": mha.embed_dim, "num_heads": mha.num_heads, "bias": mha.in_proj_bias is not None,
        "add_bias_kv": mha.bias_k is not None, "add_zero_attn": mha.add_zero_attn, "kdim": mha.kdim,
        "vdim": mha.vdim, "batch_first": mha.batch_first, "dropout": mha.dropout, "dtype": _dtype_name(some.dtype),
        "training": mha.training,
        "state": [[k, writer.tensor(v)["tensor"]] for k, v in mha.state_dict().items()],
    }


def encode(value: Any, keep=None) -> bytes:
    """``value`` as bytes; ``keep(obj) -> Handle`` stores what is not plain data (else it is an error)."""
    writer = _Writer(keep)
    header = json.dumps(writer.value(value), separators=(",", ":"), allow_nan=False).encode()
    return MAGIC + struct.pack("<Q", len(header)) + header + b"".join(writer.blobs)


class _Reader:
    def __init__(self, data: bytes, resolve, limit: int, served=None) -> None:
        self.resolve, self.served = resolve, served
        self.count = 0
        if len(data) > limit + 12:
            raise WireError(f"the message is larger than {limit // 2**20} MB")
        if data[:4] != MAGIC or len(data) < 12:
            raise WireError("not a message of this format")
        (length,) = struct.unpack("<Q", data[4:12])
        if length > MAX_HEADER_BYTES:
            raise WireError(f"the description of the values is larger than {MAX_HEADER_BYTES // 2**20} MB")
        if 12 + length > len(data):
            raise WireError("the message is cut short")
        try:
            self.header = json.loads(data[12:12 + length])
        except (ValueError, RecursionError) as error:
            raise WireError(f"unreadable header ({type(error).__name__})") from None
        self.body = memoryview(data)[12 + length:]
        self.offset = 0

    def _take(self, size: int) -> bytes:
        if size < 0 or self.offset + size > len(self.body):
            raise WireError("a tensor's bytes are missing")
        chunk = bytes(self.body[self.offset:self.offset + size])
        self.offset += size
        return chunk

    def tensor(self, info: Any) -> torch.Tensor:
        if not isinstance(info, dict) or info.get("dtype") not in DTYPES:
            raise WireError("a tensor with an unknown dtype")
        dtype = DTYPES[info["dtype"]]
        shape = info.get("shape")
        if not isinstance(shape, list) or len(shape) > 64 or not all(type(s) is int and s >= 0 for s in shape):
            raise WireError("a tensor with an invalid shape")
        numel = 1
        for s in shape:
            numel *= s
        if info.get("device") == "meta":
            t = torch.empty(shape, dtype=dtype, device="meta")
        elif info.get("device") == "cpu":
            itemsize = torch.empty((), dtype=dtype).element_size()
            if numel * itemsize > MAX_BYTES:
                raise WireError("a tensor larger than the limit")
            raw = self._take(numel * itemsize)
            flat = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.empty(0, dtype=dtype)
            t = flat.reshape(shape).clone()
        else:
            raise WireError("a tensor on an unknown device")
        if info.get("requires_grad") is True and (dtype.is_floating_point or dtype.is_complex):
            t.requires_grad_(True)
        return t

    def value(self, node: Any, depth: int = 0) -> Any:
        self.count += 1
        if self.count > MAX_VALUES or depth > MAX_DEPTH:
            raise WireError("too many or too deeply nested values")
        if node is None:
            return None
        if not isinstance(node, dict) or len(node) < 1:
            raise WireError("an unreadable value")
        kind = next(iter(node))
        body = node[kind]
        try:
            if kind == "bool" and isinstance(body, bool):
                return bool(body)
            if kind == "int" and isinstance(body, str) and len(body) <= 4300:
                return int(body)
            if kind == "float" and isinstance(body, str):
                return float.fromhex(body)
            if kind == "complex" and isinstance(body, list) and len(body) == 2:
                return complex(float.fromhex(body[0]), float.fromhex(body[1]))
            if kind == "str" and isinstance(body, str):
                return str(body)
            if kind in ("tuple", "list") and isinstance(body, list):
                items = [self.value(v, depth + 1) for v in body]
                return tuple(items) if kind == "tuple" else items
            if kind == "dict" and isinstance(body, list):
                out = {}
                for pair in body:
                    if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
                        raise WireError("an unreadable dict")
                    out[str(pair[0])] = self.value(pair[1], depth + 1)
                return out
            if kind == "tensor":
                return self.tensor(body)
            if kind == "dtype" and body in DTYPES:
                return DTYPES[body]
            if kind == "device" and isinstance(body, str) and body in ("cpu", "meta"):
                return torch.device(body)
            if kind == "generator":
                state = self.tensor(body)
                if state.dtype != torch.uint8:
                    raise WireError("an unreadable generator")
                gen = torch.Generator()
                gen.set_state(state)
                return gen
            if kind == "mha" and isinstance(body, dict):
                return self.mha(body)
            if kind == "handle" and type(body) is int and self.resolve is not None:
                return self.resolve(body, str(node.get("kind", "object"))[:200], node.get("callable") is True)
            if kind == "served" and type(body) is int and self.served is not None:
                return self.served(body)
        except (TypeError, ValueError, OverflowError, RuntimeError) as error:
            if isinstance(error, WireError):
                raise
            raise WireError(f"an unreadable {kind} ({type(error).__name__})") from None
        raise WireError(f"an unreadable value ({str(kind)[:40]})")

    def mha(self, spec: dict) -> torch.nn.MultiheadAttention:
        ints = {k: spec[k] for k in ("embed_dim", "num_heads", "kdim", "vdim")}
        if not all(type(v) is int and 0 < v <= 2**16 for v in ints.values()):
            raise WireError("an unreadable nn.MultiheadAttention")
        # Its weights come in the message: a module whose weights the message does not carry is refused
        # before it is built (building one of width 16384 takes gigabytes and a minute of CPU).
        e, k, v = ints["embed_dim"], ints["kdim"], ints["vdim"]
        weights = e * (e + k + v) + e * e  # the projections' weights alone, biases left out
        itemsize = torch.empty((), dtype=DTYPES.get(spec.get("dtype"), torch.float32)).element_size()
        if weights * itemsize > len(self.body) - self.offset:
            raise WireError("an nn.MultiheadAttention larger than the weights the message carries")
        flags = {k: spec[k] is True for k in ("bias", "add_bias_kv", "add_zero_attn", "batch_first")}
        dropout = float(spec["dropout"]) if type(spec["dropout"]) in (int, float) else 0.0
        with torch.random.fork_rng(devices=[]):
            mha = torch.nn.MultiheadAttention(dropout=dropout, dtype=DTYPES.get(spec.get("dtype"), torch.float32),
                                              **ints, **flags)
        state = {str(k): self.tensor(v) for k, v in spec["state"]}
        mha.load_state_dict(state)
        return mha.train(spec.get("training") is True)


def decode(data: bytes, resolve=None, limit: int = MAX_BYTES, served=None) -> Any:
    """The value :func:`encode` wrote; ``resolve(number, kind, callable)`` turns a handle into an object, and
    ``served(number)`` a served object's number (:class:`Served`) into what stands for it (refused without it).

    ``limit``: the largest message accepted (the grader reads a kernel's answers with :data:`MAX_REPLY_BYTES`).
    Raises :class:`WireError` on anything that is not a well-formed message within the limits.
    """
    reader = _Reader(data, resolve, limit, served)
    return reader.value(reader.header)
