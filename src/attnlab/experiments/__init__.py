"""Paper suites: each paper's claims as named, seeded runs that train, measure and write a report."""
