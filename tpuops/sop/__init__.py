"""SOPs as data: typed steps loaded from YAML, planned purely, executed over a transport."""
