"""fork_delta: the thin layer that shows, over the last fork's snapshot, the workspace now."""

from __future__ import annotations

import itertools
import os
import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bashfleet.worker.engine.snapshots import fork_delta
from bashfleet.worker.engine.snapshots.fork_delta import LayerDelta, Listing

DIR, FILE = stat.S_IFDIR | 0o755, stat.S_IFREG | 0o644
#: What the model's thin layer holds at a whiteout.
WHITEOUT = "whiteout"


def _entry(mode: int, ino: int, blocks: int = 8) -> tuple[tuple[int, ...], int]:
    return (mode, ino, 0, 0, 3, 100, 100), blocks


def _tree(**entries: tuple[int, int]) -> Listing:
    """A listing from `name=(mode, inode)` (`__` for `/` in names), its root included."""
    return {"": _entry(DIR, 1), **{k.replace("__", "/"): _entry(*v) for k, v in entries.items()}}


@pytest.mark.parametrize(("old", "new", "expected"), [
    # Unchanged: nothing to make.
    (_tree(a=(FILE, 2)), _tree(a=(FILE, 2)), LayerDelta()),
    # A file written in place, in a directory that stays as it was.
    (_tree(d=(DIR, 2), d__f=(FILE, 3)), _tree(d=(DIR, 2), d__f=(FILE, 4)),
     LayerDelta(copy=("d/f",), entries=1, bytes=4096)),
    # A file added: its directory changed too (made with its metadata now).
    (_tree(d=(DIR, 2)), _tree(d=(DIR, 3), d__g=(FILE, 4)),
     LayerDelta(copy=("d/g",), dirs=("d",), entries=2, bytes=4096)),
    # A file removed: a whiteout where it was.
    (_tree(d=(DIR, 2), d__f=(FILE, 3)), _tree(d=(DIR, 3)),
     LayerDelta(dirs=("d",), whiteouts=("d/f",), entries=2)),
    # A directory removed with what it held: one whiteout, at its top.
    (_tree(d=(DIR, 2), d__e=(DIR, 3), d__e__f=(FILE, 4)), _tree(),
     LayerDelta(whiteouts=("d",), entries=1)),
    # A new directory: copied whole (what it holds counted, not listed).
    (_tree(), _tree(n=(DIR, 5), n__f=(FILE, 6), n__g=(FILE, 7)),
     LayerDelta(copy=("n",), entries=3, bytes=3 * 4096)),
    # A file where a directory was: the file hides it, no whiteouts beneath.
    (_tree(d=(DIR, 2), d__f=(FILE, 3)), _tree(d=(FILE, 9)),
     LayerDelta(copy=("d",), entries=1, bytes=4096)),
    # A directory where a file was: copied whole, nothing beneath it to hide.
    (_tree(d=(FILE, 2)), _tree(d=(DIR, 9), d__f=(FILE, 3)),
     LayerDelta(copy=("d",), entries=2, bytes=2 * 4096)),
    # A directory removed and made again: merged, its old entries whited out one by one.
    (_tree(d=(DIR, 2), d__f=(FILE, 3), d__g=(FILE, 4)), _tree(d=(DIR, 8), d__g=(FILE, 9)),
     LayerDelta(copy=("d/g",), dirs=("d",), whiteouts=("d/f",), entries=3, bytes=4096)),
])
def test_a_layer_delta_holds_what_changed_and_hides_what_went(
    old: Listing, new: Listing, expected: LayerDelta,
) -> None:
    assert fork_delta.layer_delta(old, new) == expected


def test_a_plan_is_none_past_its_bounds_or_for_other_layers() -> None:
    old = {"root": _tree(), "work": _tree()}
    new = {"root": _tree(), "work": _tree(a=(FILE, 2), b=(FILE, 3))}
    assert fork_delta.plan(old, new, max_entries=2, max_bytes=8192) is not None
    assert fork_delta.plan(old, new, max_entries=1, max_bytes=8192) is None
    assert fork_delta.plan(old, new, max_entries=2, max_bytes=8191) is None
    assert fork_delta.plan(old, {"root": _tree()}) is None


# ---------------------------------------------------------------------- the overlay model

def _thin_layer(delta: LayerDelta, new: Listing) -> dict[str, object]:
    """What the copy makes of a plan: its entries as `new` has them, a directory copied
    whole with what it holds, the parents of all, and the whiteouts."""
    layer: dict[str, object] = {"": new[""]}
    for rel in (*delta.copy, *delta.dirs, *delta.whiteouts):
        parts = rel.split("/")
        for end in range(1, len(parts)):
            layer["/".join(parts[:end])] = new["/".join(parts[:end])]
    for rel in delta.copy:
        layer.update({r: e for r, e in new.items() if r == rel or r.startswith(rel + "/")})
    layer.update({rel: new[rel] for rel in delta.dirs})
    layer.update({rel: WHITEOUT for rel in delta.whiteouts})
    return layer


def _seen(upper: dict[str, object], lower: Listing) -> dict[str, object]:
    """Two layers as an overlay shows them: the upper's entry where it has one (a
    whiteout hides the lower's), the lower's otherwise; beneath a directory only."""
    seen: dict[str, object] = {}
    for rel in sorted(set(upper) | set(lower), key=lambda r: (r.count("/"), r)):
        parent = os.path.dirname(rel)
        if rel and not (parent in seen and stat.S_ISDIR(seen[parent][0][0])):  # type: ignore[index]
            continue
        if rel in upper:
            if upper[rel] != WHITEOUT:
                seen[rel] = upper[rel]
            continue
        # The lower's entry, unless an upper directory beneath which it sits is one the
        # lower did not have as a directory (then nothing of the lower is under it).
        if rel in lower and (not rel or (parent in lower and stat.S_ISDIR(lower[parent][0][0]))):
            seen[rel] = lower[rel]
    return seen


NAMES = ["/".join(p) for depth in (1, 2, 3) for p in itertools.product("ab", repeat=depth)]


@st.composite
def _trees(draw: st.DrawFn) -> Listing:
    chosen = draw(st.dictionaries(st.sampled_from(NAMES),
                                  st.tuples(st.booleans(), st.integers(1, 3)), max_size=14))
    tree: dict[str, tuple[tuple[int, ...], int]] = {"": _entry(DIR, 1)}
    for rel in sorted(chosen, key=lambda r: r.count("/")):
        parent = os.path.dirname(rel)
        if parent in tree and stat.S_ISDIR(tree[parent][0][0]):
            is_dir, ino = chosen[rel]
            tree[rel] = _entry(DIR if is_dir else FILE, ino)
    return tree


@given(_trees(), _trees())
def test_the_thin_layer_over_the_last_copy_shows_the_workspace_now(
    old: Listing, new: Listing,
) -> None:
    delta = fork_delta.layer_delta(old, new)
    thin = _thin_layer(delta, new)
    assert _seen(thin, old) == dict(new)
    # What it counts is what it makes, but for the layer's own directory and the
    # unchanged parents of what it makes.
    assert delta.entries == len(thin) - 1 - len(_parents(delta))


def _parents(delta: LayerDelta) -> set[str]:
    found: set[str] = set()
    for rel in (*delta.copy, *delta.dirs, *delta.whiteouts):
        parts = rel.split("/")
        found.update("/".join(parts[:end]) for end in range(1, len(parts)))
    return found - set(delta.dirs) - set(delta.copy)
