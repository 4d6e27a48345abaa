"""A class for ``make similarity``: honest answers in different styles, and copies planted among them.

The honest answers to two exercises of notebook 01 are written here independently, each in its
own style (matrix products, ``einsum``, loops, ``torch.where``, ...); every one of them is a
correct answer (tests/grading/test_similarity.py runs them through the visible checks). The planted copies
are made from them by what students do to hide a copy: nothing, renaming the variables, changing
the comments and the spacing, swapping two statements that do not depend on each other, and the
reference solution with its variables renamed.
"""

from __future__ import annotations

import ast
import io
import random
import re
import shutil
import tokenize
from pathlib import Path

import nbformat

from .course_copy import fill, reference_answers, submit
from .notebook_code import ROOT

ASSIGNMENT = "01_soft_lookup"
SDPA, HARD, NADARAYA = "scaled_dot_product_attention", "hard_lookup", "nadaraya_watson"

HEAD = {
    SDPA: 'def scaled_dot_product_attention(Q, K, V):\n    """softmax(Q K^T / sqrt(d_k)) V."""\n',
    HARD: 'def hard_lookup(query, keys, values):\n    """The value of the best key."""\n',
    NADARAYA: 'def nadaraya_watson(x_query, x_train, y_train, bandwidth):\n    """Gaussian-kernel regression."""\n',
}

#: exercise -> honest answers, each in its own style (the body under the signature).
HONEST = {
    SDPA: [
        # matmul, an explicit d_k, softmax
        """    d_k = Q.size(-1)
    if K.size(-1) != d_k or K.size(-2) != V.size(-2):
        raise ValueError(f"shapes do not fit: {Q.shape}, {K.shape}, {V.shape}")
    scale = 1.0 / math.sqrt(d_k)
    logits = torch.matmul(Q, K.transpose(-1, -2)) * scale
    attn = torch.softmax(logits, dim=-1)
    out = torch.matmul(attn, V)
    return out, attn
""",
        # einsum with a leading ellipsis
        """    if (Q.shape[-1], K.shape[-2]) != (K.shape[-1], V.shape[-2]):
        raise ValueError("Q, K and V do not fit together")
    scores = torch.einsum("...nd,...md->...nm", Q, K) / Q.shape[-1] ** 0.5
    probs = scores.softmax(dim=-1)
    return torch.einsum("...nm,...mv->...nv", probs, V), probs
""",
        # a numerically stable softmax written out
        """    if Q.shape[-1] != K.shape[-1]:
        raise ValueError("Q and K must have the same feature size")
    if K.shape[-2] != V.shape[-2]:
        raise ValueError("K and V must have the same length")
    s = (Q @ K.mT) * (Q.shape[-1] ** -0.5)
    s = s - s.amax(dim=-1, keepdim=True)
    e = torch.exp(s)
    p = e / e.sum(dim=-1, keepdim=True)
    return p @ V, p
""",
        # a loop over the queries
        """    d = K.shape[-1]
    for name, size, expected in (("Q", Q.shape[-1], d), ("V", V.shape[-2], K.shape[-2])):
        if size != expected:
            raise ValueError(f"{name} has {size} where {expected} was expected")
    rows = []
    for i in range(Q.shape[-2]):
        q = Q[..., i : i + 1, :]
        w = F.softmax((q * K).sum(-1) / math.sqrt(d), dim=-1)
        rows.append(w)
    weights = torch.stack(rows, dim=-2)
    return weights @ V, weights
""",
        # scale the queries first, bmm-like with transpose(-2, -1) and log-softmax
        """    Qs = Q / torch.tensor(Q.shape[-1], dtype=Q.dtype).sqrt()
    try:
        raw = Qs @ K.transpose(-2, -1)
        w = torch.log_softmax(raw, dim=-1).exp()
        result = w @ V
    except RuntimeError as err:
        raise ValueError(f"bad shapes: {err}") from err
    return result, w
""",
    ],
    HARD: [
        # argmax and one_hot
        """    best = torch.argmax(keys @ query)
    onehot = F.one_hot(best, num_classes=keys.shape[0]).to(values.dtype)
    return onehot @ values
""",
        # torch.where on the maximum, first tie kept by a cumulative sum
        """    sims = torch.mv(keys, query)
    is_max = torch.where(sims == sims.max(), 1.0, 0.0)
    first = is_max * (torch.cumsum(is_max, 0) == 1)
    return (first.unsqueeze(1) * values).sum(0)
""",
        # a loop keeping the best score
        """    best_i, best_s = 0, None
    for i in range(keys.shape[0]):
        s = torch.dot(keys[i], query)
        if best_s is None or s > best_s:
            best_i, best_s = i, s
    w = torch.zeros(keys.shape[0], dtype=values.dtype)
    w[best_i] = 1
    return w @ values
""",
        # max with its index, scatter into zeros
        """    _, idx = (keys * query).sum(dim=1).max(dim=0)
    weights = torch.zeros(len(keys), dtype=values.dtype).scatter(0, idx.view(1), 1.0)
    return torch.einsum("m,mv->v", weights, values)
""",
        # sort the scores
        """    order = torch.sort(keys @ query, descending=True, stable=True).indices
    mask = torch.zeros_like(keys[:, 0])
    mask[order[0]] = 1.0
    return mask.to(values.dtype) @ values
""",
    ],
}

#: Variables of answers renamed by a copier (names that no answer above uses as a global).
NEW_NAMES = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa", "lam", "mu"]


def answer(exercise: str, body: str) -> str:
    return HEAD[exercise] + body


def honest_answers(exercise: str) -> list[str]:
    return [answer(exercise, body) for body in HONEST[exercise]]


def rename_locals(source: str, seed: int = 0) -> str:
    """``source`` with every argument and local variable of its function renamed (not the function)."""
    function = next(s for s in ast.parse(source).body if isinstance(s, ast.FunctionDef))
    local = {a.arg for a in function.args.args}
    local |= {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    names = NEW_NAMES[:]
    random.Random(seed).shuffle(names)
    mapping = dict(zip(sorted(local), names))
    tokens, previous = [], None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NAME and token.string in mapping and not (previous and previous.string == "."):
            token = token._replace(string=mapping[token.string])
        elif token.type == tokenize.STRING and re.match(r"[rbRB]?[fF]", token.string):  # one token before 3.12
            token = token._replace(string=re.sub(r"(?<![\w.])(\w+)\b", lambda m: mapping.get(m[1], m[1]), token.string))
        tokens.append(token)
        if token.type not in (tokenize.NL, tokenize.COMMENT):
            previous = token
    return tokenize.untokenize(tokens)


def restyle(source: str) -> str:
    """``source`` with other comments, spacing and blank lines (the same tokens)."""
    lines = []
    for line in source.splitlines():
        if line.strip().startswith("#"):
            continue
        code = re.sub(r"\s*#.*$", "", line) if '"' not in line else line
        code = re.sub(r"(?<=[\w)\]]) ?([-+*/@]|==) ?(?=[\w(\[])", r"  \1  ", code)
        code = code.replace(", ", " ,  ")
        indent = len(code) - len(code.lstrip())
        if indent and lines and not lines[-1].strip().startswith(("def", "if", "for")):
            lines.append(" " * indent + "# my own working, step by step")
        lines.append(code)
        lines.append("")
    return "\n".join(lines) + "\n"


def reorder(source: str) -> str:
    """``source`` with the first two adjacent statements of its function that do not depend on each other swapped."""
    function = ast.parse(source).body[0]
    body = function.body[1:] if isinstance(function.body[0].value if isinstance(function.body[0], ast.Expr)
                                           else None, ast.Constant) else function.body
    lines = source.splitlines(keepends=True)
    for first, second in zip(body, body[1:]):
        writes = [{n.id for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
                  for s in (first, second)]
        reads = [{n.id for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
                 for s in (first, second)]
        if writes[0] & (reads[1] | writes[1]) or writes[1] & reads[0] or isinstance(first, ast.Return) \
                or isinstance(second, ast.Return):
            continue
        a = lines[first.lineno - 1: first.end_lineno]
        b = lines[second.lineno - 1: second.end_lineno]
        return "".join(lines[: first.lineno - 1] + b + a + lines[second.end_lineno:])
    raise ValueError("no two adjacent independent statements to swap")


def make_class_course(tmp: Path) -> Path:
    """A course folder with notebook 01's source and release (all that ``make similarity`` reads) and no submission."""
    shutil.copy(ROOT / "nbgrader_config.py", tmp / "nbgrader_config.py")
    shutil.copytree(ROOT / "source" / ASSIGNMENT, tmp / "source" / ASSIGNMENT)
    (tmp / "notebooks").mkdir()
    shutil.copy(ROOT / "notebooks" / f"{ASSIGNMENT}.ipynb", tmp / "notebooks" / f"{ASSIGNMENT}.ipynb")
    return tmp


def release(course: Path) -> nbformat.NotebookNode:
    return nbformat.read(course / "notebooks" / f"{ASSIGNMENT}.ipynb", as_version=4)


#: Planted copies: (kind, the honest answer copied, how the copy is made).
PLANTS = [
    ("identical", 0, lambda s: s),
    ("variables renamed", 1, lambda s: rename_locals(s, seed=1)),
    ("comments and spacing changed", 3, restyle),
    ("statements reordered", 2, reorder),
    ("all of the above", 2, lambda s: restyle(reorder(rename_locals(s, seed=2)))),
]


def planted_class(course: Path) -> dict[str, list[set[str | None]]]:
    """Submit the test class to ``course``; return, per exercise, its families of answers.

    Every exercise of :data:`HONEST` gets one honest student per style (``<exercise>-honest-<i>``),
    a copy of an honest student's answer for each of :data:`PLANTS` (``<exercise>-copy-<j>``), and
    one student who handed in the reference solution with its variables renamed (``<exercise>-ref``).
    Each student answers only that exercise (the rest is left as released). A family is an honest
    answer and its copies, or the reference solution (``None``) and its copy: a pair within a family
    is planted, a pair across families honest.
    """
    student_version = release(course)
    reference = reference_answers(ASSIGNMENT)
    families = {}
    for exercise in HONEST:
        honest = honest_answers(exercise)
        students = {f"{exercise}-honest-{i}": text for i, text in enumerate(honest)}
        family: list[set[str | None]] = [{student} for student in students]
        for j, (_, original, make) in enumerate(PLANTS):
            copier = f"{exercise}-copy-{j}"
            students[copier] = make(honest[original])
            family[original].add(copier)
        students[f"{exercise}-ref"] = rename_locals(reference[exercise], seed=7)
        family.append({None, f"{exercise}-ref"})
        for student, text in students.items():
            submit(course, ASSIGNMENT, student, fill(student_version, {exercise: text}))
        families[exercise] = family
    return families
