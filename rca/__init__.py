"""fleetscope.rca: root-cause answers in a terminal (a REST client of the server)."""
