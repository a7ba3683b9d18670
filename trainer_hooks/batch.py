"""Rows of one record type held column by column, as the background thread builds them.

The recorder turns queued items into columns in bulk (one list per column, extended a
batch of items at a time) instead of one dict per row, and the spool sink encodes the
columns directly (:class:`.encode.ColumnEncoder`). Columns with the same value in every
row of a rank (job, attempt, rank, host) are not stored at all: they are part of the
batch's :class:`ColumnSpec`. Sinks that want rows get them from :meth:`Columns.rows`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from fleetscope.trainer_hooks.encode import ColumnEncoder

from fleetscope.schema import record_type as lookup


class ColumnSpec:
    """The shape of one record type's batches on one rank, and their encoder."""

    __slots__ = ("record_type", "consts", "names", "trusted", "_encoder")

    def __init__(self, record_type: str, consts: dict[str, Any], names: Sequence[str],
                 trusted: frozenset[str] = frozenset()) -> None:
        """
        Args:
            record_type: The record type (a :data:`fleetscope.schema.RECORD_TYPES` key).
            consts: Columns with one value in every row (e.g. job, rank).
            names: The other columns, in the order values are given.
            trusted: Numeric columns whose values the recorder computes itself (ints), so
                the encoder need not check their types.
        """
        self.record_type = record_type
        self.consts = dict(consts)
        self.names = tuple(names)
        self.trusted = frozenset(trusted)
        self._encoder: ColumnEncoder | None = None

    @property
    def encoder(self) -> ColumnEncoder:
        """The encoder of these batches (built on first use)."""
        if self._encoder is None:
            self._encoder = ColumnEncoder(lookup(self.record_type), self.names, self.consts,
                                          self.trusted)
        return self._encoder


class Columns:
    """Rows of one record type: one list per non-constant column."""

    __slots__ = ("spec", "cols", "n")

    def __init__(self, spec: ColumnSpec) -> None:
        self.spec = spec
        self.cols: list[list[Any]] = [[] for _ in spec.names]
        self.n = 0

    def extend(self, columns: Sequence[Sequence[Any]]) -> None:
        """Add rows given column by column (one sequence per name, all of one length)."""
        if len(columns) != len(self.cols) or len(set(map(len, columns))) != 1:
            raise ValueError(f"{self.spec.record_type}: ragged columns")
        n = len(columns[0])
        for dst, src in zip(self.cols, columns):
            dst.extend(src)
        self.n += n

    def append(self, values: Sequence[Any]) -> None:
        """Add one row given as values in ``spec.names`` order."""
        if len(values) != len(self.cols):
            raise ValueError(f"{self.spec.record_type}: {len(values)} values for "
                             f"{len(self.cols)} columns")
        for dst, v in zip(self.cols, values):
            dst.append(v)
        self.n += 1

    def __len__(self) -> int:
        return self.n

    def rows(self) -> list[dict[str, Any]]:
        """The rows as dicts (constant columns included)."""
        names, consts = self.spec.names, self.spec.consts
        return [{**consts, **dict(zip(names, values))} for values in zip(*self.cols)]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows())

    def ipc_stream(self) -> bytes:
        """The rows as one uncompressed Arrow IPC stream (see :mod:`.encode`)."""
        return self.spec.encoder.stream(self.cols, self.n, self.rows)


def rows_of(batch: Any) -> list[dict[str, Any]]:
    """The rows of a batch: a :class:`Columns` or already a list of row dicts."""
    return batch.rows() if isinstance(batch, Columns) else batch
