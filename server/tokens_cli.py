"""``fleetscope token create|list|revoke``: scoped API tokens in the control-plane DB."""

from __future__ import annotations

import argparse
import json
import os

HELP = """\
Make, list and revoke scoped API tokens. Only a SHA-256 digest of each token is stored;
`create` prints the token once and it cannot be shown again.

scopes:
  ingest  agents and trainers: POST /api/v1/ingest, GET /api/v1/clock; nothing else
          (an ingest token cannot read or change alert rules)
  read    every GET route and the dashboard (/ui); changes nothing
  admin   everything: alert rules, webhooks, incident actions, ...
A token may be limited to jobs (--jobs) and hosts (--hosts): a limited token may call
only routes that name one of them (path or ?job= / ?host=; for ingest the
X-Fleetscope-Host header the agent sends; ingest tokens take --hosts only). The static FLEETSCOPE_TOKEN is an unlimited
admin token. Once any token exists the server requires one on every route but health.
The server sees a new or revoked token within FLEETSCOPE_TOKEN_CACHE_S (default 2 s).
"""

EPILOG = """\
examples:
  fleetscope token create --scope ingest --name rack-7 --hosts node-70,node-71 > agent.token
  fleetscope agent --server http://ctl:8000 --spool /var/spool/fleetscope --token-file agent.token
  fleetscope token create --scope read --name grafana --jobs llama-70b
  fleetscope token list
  fleetscope token revoke 3
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("token", help="make, list and revoke scoped API tokens",
                              description=HELP, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", metavar="URL", help="control-plane DB (default $FLEETSCOPE_DB_URL, "
                   "else sqlite:///./.fleetscope/control.db): the server's --db")
    sub = p.add_subparsers(dest="token_command", metavar="ACTION")
    c = sub.add_parser("create", help="make a token and print it (once)")
    c.add_argument("--scope", required=True, choices=["ingest", "read", "admin"])
    c.add_argument("--name", default="", help="what it is for (shown by list)")
    c.add_argument("--jobs", default="", metavar="A,B", help="limit it to these job ids")
    c.add_argument("--hosts", default="", metavar="H1,H2", help="limit it to these hosts")
    c.add_argument("--json", action="store_true", help="print the record and token as JSON")
    ls = sub.add_parser("list", help="tokens (never the tokens themselves)")
    ls.add_argument("--all", action="store_true", help="include revoked tokens")
    ls.add_argument("--json", action="store_true", help="JSON instead of a table")
    r = sub.add_parser("revoke", help="revoke a token by id")
    r.add_argument("id", type=int)
    p.set_defaults(func=run)


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def run(args: argparse.Namespace) -> int:
    import sys

    from fleetscope.server import tokens
    from fleetscope.server.db import open_db

    from fleetscope.cli import CliError
    from fleetscope.config import DEFAULT_DB_URL

    if not getattr(args, "token_command", None):
        raise CliError("expected an action: create, list or revoke (see fleetscope token --help)")
    url = args.db or os.environ.get("FLEETSCOPE_DB_URL") or DEFAULT_DB_URL
    if not url.startswith(("sqlite:", "postgresql:", "postgresql+")):
        raise CliError(f"--db {url!r}: expected sqlite:///path or postgresql://...")
    db = open_db(url)
    try:
        with db() as session:
            if args.token_command == "create":
                token, rec = tokens.create_token(session, args.scope, args.name,
                                                 _csv(args.jobs), _csv(args.hosts))
                if args.json:
                    print(json.dumps({**rec, "token": token}))
                else:
                    print(token)
                    print(f"token {rec['id']} ({rec['scope']}) made; it is shown only now, store "
                          "it safely (e.g. a file for --token-file)", file=sys.stderr)
            elif args.token_command == "list":
                rows = tokens.list_tokens(session, include_revoked=args.all)
                if args.json:
                    print(json.dumps(rows))
                else:
                    print(f"{'id':>4}  {'scope':<6}  {'prefix':<10}  {'name':<20}  limits")
                    for t in rows:
                        lim = ", ".join([f"jobs={','.join(t['jobs'])}"] * bool(t["jobs"])
                                        + [f"hosts={','.join(t['hosts'])}"] * bool(t["hosts"]))
                        rev = "  (revoked)" if t["revoked_ns"] else ""
                        print(f"{t['id']:>4}  {t['scope']:<6}  {t['prefix']:<10}  {t['name'][:20]:<20}  "
                              f"{lim or '-'}{rev}")
            else:
                rec = tokens.revoke_token(session, args.id)
                print(f"token {rec['id']} ({rec['scope']}, {rec['name'] or 'unnamed'}) revoked")
    except tokens.TokenError as e:
        raise CliError(str(e)) from None
    finally:
        db.kw["bind"].dispose()
    return 0
