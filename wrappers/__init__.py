"""Source wrappers: capture committed changes, ship them in order, answer subqueries."""
