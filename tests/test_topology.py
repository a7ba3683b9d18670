import pytest

from fleetscope.topology import Coords, Topology


def test_default_order_is_megatron_tp_fastest():
    t = Topology(dp=2, tp=2, pp=2)
    assert t.world_size == 8
    assert t.coords(0) == Coords(dp=0, pp=0, tp=0)
    assert t.coords(1) == Coords(dp=0, pp=0, tp=1)
    assert t.coords(2) == Coords(dp=1, pp=0, tp=0)
    assert t.coords(4) == Coords(dp=0, pp=1, tp=0)
    assert t.coords(7) == Coords(dp=1, pp=1, tp=1)


@pytest.mark.parametrize("order", ["tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "pp-dp-tp"])
@pytest.mark.parametrize("dims", [(1, 1, 1), (2, 2, 2), (3, 2, 4), (192, 8, 8)])
def test_rank_coords_roundtrip_and_groups_partition(order, dims):
    dp, tp, pp = dims
    t = Topology(dp=dp, tp=tp, pp=pp, order=order)
    for r in range(0, t.world_size, max(1, t.world_size // 97)):
        c = t.coords(r)
        assert t.rank(dp=c.dp, pp=c.pp, tp=c.tp) == r
    if t.world_size <= 64:
        for axis in ("dp", "tp", "pp"):
            groups = t.groups(axis)
            members = sorted(r for g in groups.values() for r in g)
            assert members == list(range(t.world_size))
            assert all(len(g) == t.size(axis) for g in groups.values())
            for gid, ranks in groups.items():
                assert t.parse_group_id(gid) == (axis, ranks)
                for r in ranks:
                    assert t.group_id(axis, r) == gid


def test_group_ids_and_pipeline_neighbours():
    t = Topology(dp=2, tp=2, pp=2)
    assert t.group_id("tp", 3) == "tp.pp0.dp1"
    assert t.group_ranks("tp", 3) == [2, 3]
    assert t.group_ranks("dp", 1) == [1, 3]
    assert t.group_ranks("pp", 1) == [1, 5]
    assert t.next_stage_rank(1) == 5 and t.prev_stage_rank(5) == 1
    assert t.next_stage_rank(5) is None and t.prev_stage_rank(1) is None
    assert t.display_order()[:4] == [0, 1, 2, 3]
    assert Topology.from_dict(t.to_dict()) == t


@pytest.mark.parametrize(
    "kwargs,msg",
    [({"dp": 0}, "dp"), ({"tp": -1}, "tp"), ({"pp": 1.5}, "pp"), ({"order": "tp-dp"}, "order")],
)
def test_validation_names_the_bad_value(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        Topology(**kwargs)
    with pytest.raises(ValueError, match="out of range"):
        Topology(dp=2).coords(2)
