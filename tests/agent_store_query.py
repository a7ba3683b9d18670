"""Query a (stopped) server's chdb store from a subprocess; prints JSON rows.

``python tests/agent_store_query.py STORE_URL "SELECT ..."`` — the agent tests run it
after stopping the server, because one process at a time owns a chdb directory.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    from fleetscope.server.store import Store

    store = Store.open(sys.argv[1], migrate_schema=False)
    out = [store.query_rows(sql) for sql in sys.argv[2:]]
    print(json.dumps(out, default=str))
    store.close()


if __name__ == "__main__":
    main()
