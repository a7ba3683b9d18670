"""Pure figure builders: REST payload (plain dicts) in, plotly figure out. No I/O."""
