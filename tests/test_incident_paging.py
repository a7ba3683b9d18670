"""``GET /incidents`` loads one page per request, not every row (issue #13 item 19).

The route function runs on a real SQLite control-plane DB (made by the migrations);
an ORM ``load`` listener counts the incident rows each request materialises, and
``EXPLAIN QUERY PLAN`` shows the listing is served by an index, not a sort of all rows.
"""

from __future__ import annotations

from fleetscope.dashboard.client import INCIDENTS_PAGE, ApiClient
from fleetscope.server.api.routes.incidents import list_incidents
from fleetscope.server.db import open_db
from fleetscope.server.db.diagnosis_models import Incident, dumps
from sqlalchemy import event, text

N = 3000


def _db(tmp_path):
    db = open_db(f"sqlite:///{tmp_path / 'control.db'}")
    with db() as s:
        s.add_all(Incident(job=f"j{i % 7}", key=f"k{i}", kind="straggler", status="resolved" if i % 3 else "open",
                           ranks=dumps([i % 50, 13] if i % 2 else [3]), opened_ns=1_000 + i, updated_ns=1_000 + i)
                  for i in range(N))
        s.commit()
    return db


def _page(session, **kw):
    args = dict(job=None, status=None, kind=None, rank=None, limit=50, offset=0)
    args.update(kw)
    return list_incidents(session, **args)


def test_a_page_loads_only_its_rows_and_counts_the_rest(tmp_path):
    db = _db(tmp_path)
    loaded = []

    def on_load(target, _ctx):
        loaded.append(target.id)

    event.listen(Incident, "load", on_load)
    try:
        with db() as s:
            page = _page(s, limit=10, offset=20)
            assert page["total"] == N and len(page["items"]) == 10
            assert [i["opened_ns"] for i in page["items"]] == list(range(1_000 + N - 21, 1_000 + N - 31, -1))
            assert len(loaded) == 10, f"loaded {len(loaded)} rows for a page of 10"
            loaded.clear()
            page = _page(s, status="open", limit=5)
            assert page["total"] == len(range(0, N, 3)) and len(loaded) == 5
            assert all(i["status"] == "open" for i in page["items"])
    finally:
        event.remove(Incident, "load", on_load)


def test_rank_filter_matches_whole_list_elements_in_sql(tmp_path):
    db = _db(tmp_path)
    with db() as s:
        p3 = _page(s, rank=3, limit=1000)
        # [3] for even i; [i % 50, 13] holds 3 when i % 50 == 3 (odd i): 1500 + 60
        assert p3["total"] == N // 2 + len([i for i in range(N) if i % 2 and i % 50 == 3])
        assert all(3 in i["ranks"] for i in p3["items"])
        p1 = _page(s, rank=1, limit=1000)  # must not match 13 (a digit run)
        assert p1["total"] == len([i for i in range(N) if i % 2 and i % 50 == 1])


def test_listing_uses_an_index(tmp_path):
    db = _db(tmp_path)
    with db() as s:
        plan = " ".join(str(r) for r in s.execute(text(
            "EXPLAIN QUERY PLAN SELECT * FROM incidents WHERE status = 'open' "
            "ORDER BY opened_ns DESC, id DESC LIMIT 50")))
    assert "ix_incidents_status_opened" in plan and "TEMP B-TREE" not in plan


def test_dashboard_polls_a_bounded_page():
    seen = {}

    class Probe(ApiClient):
        def get(self, path, **params):
            seen.update(params, path=path)
            return None

    Probe("http://127.0.0.1:1").incidents(status="open")
    assert seen == {"path": "/incidents", "status": "open", "limit": INCIDENTS_PAGE}
    assert INCIDENTS_PAGE <= 200
