"""Rows of one record type held column by column, as the background thread builds them.

The recorder turns queued items into columns in bulk (one list per column, extended a
batch of items at a time) instead of one dict per row, and the spool sink encodes the
columns directly (:class:`.encode.ColumnEncoder`). Columns with the same value in every
row of a rank (job, attempt, rank, host) are not stored at all: they are part of the
batch's :class:`ColumnSpec`. Sinks that want rows get them from :meth:`Columns.rows`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
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
    """Rows of one record type, held as they come: chunks of columns (one sequence per
    non-constant column, as the bulk conversion makes them) and single rows (tuples),
    joined into one sequence per column only when encoded."""

    __slots__ = ("spec", "chunks", "pending", "n")

    def __init__(self, spec: ColumnSpec) -> None:
        self.spec = spec
        self.chunks: list[Sequence[Sequence[Any]]] = []
        self.pending: list[Sequence[Any]] = []
        self.n = 0

    def extend(self, columns: Sequence[Sequence[Any]]) -> None:
        """Add rows given column by column (one sequence per name, all of one length;
        kept as given, not copied)."""
        if len(columns) != len(self.spec.names) or len(set(map(len, columns))) != 1:
            raise ValueError(f"{self.spec.record_type}: ragged columns")
        if self.pending:
            self._seal()
        self.chunks.append(columns)
        self.n += len(columns[0])

    def append(self, values: Sequence[Any]) -> None:
        """Add one row given as values in ``spec.names`` order."""
        if len(values) != len(self.spec.names):
            raise ValueError(f"{self.spec.record_type}: {len(values)} values for "
                             f"{len(self.spec.names)} columns")
        self.pending.append(values)
        self.n += 1

    def _seal(self) -> None:
        self.chunks.append(tuple(zip(*self.pending)))
        self.pending = []

    @property
    def cols(self) -> Sequence[Sequence[Any]]:
        """One sequence of all values per name in ``spec.names``."""
        if self.pending:
            self._seal()
        chunks = self.chunks
        if len(chunks) != 1:
            if not chunks:
                return [[] for _ in self.spec.names]
            merged = tuple(list(chain.from_iterable(c[i] for c in chunks))
                           for i in range(len(self.spec.names)))
            self.chunks = chunks = [merged]
        return chunks[0]

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
        spec = self.spec
        encoder = spec._encoder or spec.encoder
        return encoder.stream(self.cols, self.n, self.rows)


def rows_of(batch: Any) -> list[dict[str, Any]]:
    """The rows of a batch: a :class:`Columns` or already a list of row dicts."""
    return batch.rows() if isinstance(batch, Columns) else batch
