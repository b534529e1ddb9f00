"""The Events tab: the latest operations, then every event in time order."""
