"""The manager: receives source updates and maintains SPJ views with PVM over SWEEP."""
