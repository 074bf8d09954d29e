"""The benchmark harness: recipes x seeds under a fixed NFE budget, with a report."""
