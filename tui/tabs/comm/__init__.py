"""The Comm tab: per collective kind and per rank, bandwidth against the link, exposed time, verdicts."""
