"""What ggml's graph allocator does with a compute graph, replayed: the size of the compute buffer llama.cpp
reserves, to the byte.

Read from ggml/src/ggml.c (`ggml_visit_parents_graph`: nodes in depth-first order, sources left to right) and
ggml/src/ggml-alloc.c (`ggml_gallocr_alloc_graph_impl` and the dynamic tensor allocator) of the llama.cpp copy in
llama-cpp-python 0.3.36:

- inputs (leaves without data) are allocated first, in leaf order, then every node in graph order; a view takes
  no memory of its own and keeps its source alive;
- an op that may run in place (`ggml_op_can_inplace`) reuses its first own, non-output source of the same type
  and shape whose last consumer it is;
- a tensor is freed once its last consumer and its last view are done; outputs never are;
- the allocator pads every size to the buffer's alignment, takes the best-fitting free block (the last block,
  which can grow, only when no other fits) and merges freed blocks with their neighbours; the buffer is the
  highest address ever reached.

Only what allocation depends on is kept: op, type, shape, sources, what a view is a view of, and the flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TYPE_BYTES = {"f32": 4, "f16": 2, "i32": 4, "i64": 8}
# ggml_op_can_inplace, for the ops the graphs here use
IN_PLACE = frozenset({"ADD", "ADD_ID", "MUL", "DIV", "SCALE", "CLAMP", "RMS_NORM", "ROPE", "SOFT_MAX", "UNARY"})
CPU_ALIGNMENT = 32  # TENSOR_ALIGNMENT (ggml-impl.h): the CPU buffer type's alignment


@dataclass(eq=False, kw_only=True)
class Tensor:
    """One ggml tensor as the allocator sees it. `external`: its data lives elsewhere (weights, the KV cache)."""

    op: str  # "NONE" for a leaf
    type: str  # a key of TYPE_BYTES, or "external" for data the graph does not allocate
    ne: tuple[int, int, int, int]
    srcs: tuple[Tensor, ...] = ()
    view_of: Tensor | None = None  # the tensor whose memory this views (never itself a view)
    is_input: bool = False
    is_output: bool = False
    external: bool = False

    @property
    def nbytes(self) -> int:
        n = TYPE_BYTES[self.type]
        for d in self.ne:
            n *= d
        return n


def _ne(*ne: int) -> tuple[int, int, int, int]:
    return (*ne, *(1,) * (4 - len(ne)))  # type: ignore[return-value]


def external(*ne: int, type: str = "f16") -> Tensor:
    """Weights or the KV cache: read by the graph, allocated elsewhere."""
    return Tensor(op="NONE", type=type, ne=_ne(*ne), external=True)


def input_(type: str, *ne: int) -> Tensor:
    return Tensor(op="NONE", type=type, ne=_ne(*ne), is_input=True)


def view(a: Tensor, *ne: int, op: str = "VIEW") -> Tensor:
    """A view, reshape or permute of `a` with shape `ne`."""
    return Tensor(op=op, type=a.type, ne=_ne(*ne), srcs=(a,), view_of=a.view_of or a)


def permute(a: Tensor, *axes: int) -> Tensor:
    ne = [0] * 4
    for i, axis in enumerate(axes):
        ne[axis] = a.ne[i]
    return view(a, *ne, op="PERMUTE")


def mul_mat(a: Tensor, b: Tensor) -> Tensor:
    return Tensor(op="MUL_MAT", type="f32", ne=(a.ne[1], b.ne[1], b.ne[2], b.ne[3]), srcs=(a, b))


def mul_mat_id(experts: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """Each token through its selected experts: (rows of an expert, experts per token, tokens)."""
    return Tensor(op="MUL_MAT_ID", type="f32", ne=(experts.ne[1], ids.ne[0], b.ne[2], 1), srcs=(experts, b, ids))


def get_rows(a: Tensor, rows: Tensor) -> Tensor:
    return Tensor(op="GET_ROWS", type="f32", ne=(a.ne[0], rows.ne[0], rows.ne[1], rows.ne[2]), srcs=(a, rows))


def like(op: str, a: Tensor, *others: Tensor) -> Tensor:
    """An op whose result has `a`'s type and shape (norms, element-wise ops, RoPE, softmax, GLU)."""
    return Tensor(op=op, type=a.type, ne=a.ne, srcs=(a, *others))


def cont(a: Tensor, *ne: int) -> Tensor:
    return Tensor(op="CONT", type=a.type, ne=_ne(*ne), srcs=(a,))


def set_rows(dst: Tensor, values: Tensor, rows: Tensor) -> Tensor:
    """Rows written into `dst` (the KV cache): a view of it."""
    return Tensor(op="SET_ROWS", type=dst.type, ne=dst.ne, srcs=(dst, values, rows), view_of=dst.view_of or dst)


def flash_attn(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    return Tensor(op="FLASH_ATTN_EXT", type="f32", ne=(v.ne[0], q.ne[2], q.ne[1], q.ne[3]), srcs=(q, k, v, mask))


@dataclass
class Graph:
    """Nodes and leaves in the order ggml_build_forward_expand adds them."""

    nodes: list[Tensor] = field(default_factory=list)
    leafs: list[Tensor] = field(default_factory=list)
    _seen: set[int] = field(default_factory=set)

    def expand(self, t: Tensor) -> None:
        stack: list[tuple[Tensor, bool]] = [(t, False)]
        while stack:  # depth first, sources left to right, a tensor after its sources
            cur, done = stack.pop()
            if done:
                (self.leafs if cur.op == "NONE" else self.nodes).append(cur)
                continue
            if id(cur) in self._seen:
                continue
            self._seen.add(id(cur))
            stack.append((cur, True))
            stack.extend((s, False) for s in reversed(cur.srcs))


class _Blocks:
    """ggml_dyn_tallocr with one chunk: free blocks sorted by offset, the last one unbounded."""

    def __init__(self, alignment: int):
        self.alignment = alignment
        self.free: list[list[int]] = [[0, 1 << 62]]
        self.max_size = 0

    def pad(self, size: int) -> int:
        return -(-size // self.alignment) * self.alignment

    def alloc(self, size: int) -> int:
        size = self.pad(size)
        best, best_size = len(self.free) - 1, None
        for i, (_, block) in enumerate(self.free[:-1]):
            if block >= size and (best_size is None or block <= best_size):
                best, best_size = i, block
        offset = self.free[best][0]
        self.free[best][0] += size
        self.free[best][1] -= size
        if self.free[best][1] == 0:
            del self.free[best]
        self.max_size = max(self.max_size, offset + size)
        return offset

    def release(self, offset: int, size: int) -> None:
        size = self.pad(size)
        for i, block in enumerate(self.free):
            if block[0] + block[1] == offset:  # ends where this begins
                block[1] += size
                if i + 1 < len(self.free) and block[0] + block[1] == self.free[i + 1][0]:
                    block[1] += self.free.pop(i + 1)[1]
                return
            if offset + size == block[0]:  # begins where this ends
                block[0], block[1] = offset, block[1] + size
                if i > 0 and self.free[i - 1][0] + self.free[i - 1][1] == block[0]:
                    self.free[i - 1][1] += self.free.pop(i)[1]
                return
        at = next((i for i, b in enumerate(self.free) if b[0] >= offset), len(self.free))
        self.free.insert(at, [offset, size])


def reserve(graph: Graph, alignment: int = CPU_ALIGNMENT) -> int:
    """The bytes ggml_gallocr reserves for `graph` (one buffer type)."""
    blocks = _Blocks(alignment)
    children: dict[int, int] = {}
    views: dict[int, int] = {}
    offset: dict[int, int] = {}
    own: set[int] = set()

    def allocate(t: Tensor) -> None:
        if t.external or id(t) in own or t.view_of is not None:
            return
        own.add(id(t))
        if t.op in IN_PLACE:
            for p in t.srcs:
                if (id(p) in own and not p.is_output and (p.type, p.ne) == (t.type, t.ne)
                        and children.get(id(p)) == 1 and not views.get(id(p))):
                    offset[id(t)] = offset[id(p)]
                    own.discard(id(p))
                    return
        offset[id(t)] = blocks.alloc(t.nbytes)

    def free(t: Tensor) -> None:
        if not t.is_output:
            blocks.release(offset[id(t)], t.nbytes)
            own.discard(id(t))

    for leaf in graph.leafs:
        allocate(leaf)
    for node in graph.nodes:
        if node.view_of is not None:
            views[id(node.view_of)] = views.get(id(node.view_of), 0) + 1
        for s in node.srcs:
            children[id(s)] = children.get(id(s), 0) + 1
            if s.is_input:
                allocate(s)
    for node in graph.nodes:
        for s in node.srcs:
            allocate(s)
        allocate(node)
        for p in node.srcs:
            children[id(p)] -= 1
            if children[id(p)] or views.get(id(p)):
                continue
            if p.view_of is not None:
                root = p.view_of
                views[id(root)] -= 1
                if not views[id(root)] and not children.get(id(root)) and id(root) in own:
                    free(root)
            elif id(p) in own:
                free(p)
    return blocks.max_size
