"""API models (pydantic). Record models are generated from :mod:`fleetscope.schema`,
so the JSON ingest format documented in OpenAPI is the schema, by construction."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from fleetscope.schema import PYTHON_TYPES, RECORD_TYPES, SCHEMA_VERSION, RecordType


def _nan() -> float:
    return math.nan


def record_model(rt: RecordType) -> type[BaseModel]:
    """A pydantic model of one record type (required columns without default)."""
    fields: dict[str, Any] = {}
    for c in rt.columns:
        t = PYTHON_TYPES[c.type]
        if isinstance(c.default, float) and math.isnan(c.default):
            # a NaN default is not JSON: OpenAPI would fail to render (500). A factory
            # keeps the model's default and leaves it out of the JSON schema.
            doc = f"{c.doc} (omitted or null: NaN)"
            fields[c.name] = (t, Field(default_factory=_nan, description=doc))
            continue
        default = ... if c.required else c.default
        fields[c.name] = (t, Field(default, description=c.doc))
    return create_model(
        f"{''.join(p.title() for p in rt.name.split('_'))}Record",
        __config__=ConfigDict(extra="forbid"),
        __doc__=rt.doc,
        **fields,
    )


RECORD_MODELS: dict[str, type[BaseModel]] = {name: record_model(rt) for name, rt in RECORD_TYPES.items()}

_record_lists: dict[str, Any] = {name: (list[m] | None, None) for name, m in RECORD_MODELS.items()}  # type: ignore[valid-type]
JsonRecords = create_model("JsonRecords", __config__=ConfigDict(extra="forbid"), **_record_lists)


class JsonBatch(BaseModel):
    """The JSON wire format of ``POST /api/v1/ingest``."""

    schema_version: int = SCHEMA_VERSION
    records: JsonRecords  # type: ignore[valid-type]


class IngestResponse(BaseModel):
    accepted: bool
    rows: dict[str, int] = Field(description="rows per record type in this batch")
    duplicate: bool = Field(description="every table of this batch was already stored")


class Topology(BaseModel):
    dp: int
    tp: int
    pp: int
    order: str
    world_size: int


class JobPublic(BaseModel):
    id: str
    name: str
    attempt: int
    status: str
    topology: Topology
    num_microbatches: int
    model_flops_per_step: float
    device_name: str
    device_peak_flops: float
    start_ns: int | None
    end_ns: int | None
    command: str
    versions: str
    host: str


class JobDetail(JobPublic):
    last_step: int | None = Field(None, description="latest step with a step marker")
    num_ranks_reporting: int = Field(0, description="ranks with step data in the latest steps")
    steps_per_s: float | None = Field(None, description="over the last 20 completed steps")
    mfu: float | None = Field(
        None,
        description="model FLOPs utilisation: model_flops_per_step * steps_per_s / "
        "(world_size * device_peak_flops); null when any factor is unknown",
    )


class StepRow(BaseModel):
    step: int
    rank: int
    total_ns: int = Field(description="step duration (sum of the parts if no step marker)")
    compute_ns: int = Field(description="compute + optimizer section time")
    communication_ns: int = Field(description="collective and p2p time")
    data_loading_ns: int
    idle_ns: int = Field(description="total minus every timed part, floored at 0")
    optimizer_ns: int
    other_ns: int = Field(description="sections of kind 'other'")
    comm_dp_ns: int
    comm_tp_ns: int
    comm_pp_ns: int
    num_collectives: int


class StepBreakdown(BaseModel):
    job: str
    attempt: int
    rows: list[StepRow]
    truncated: bool = Field(description="more rows matched than `limit`")
