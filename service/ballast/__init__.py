"""Ballast advice (``GET /api/v1/ballast``): how big and how many placeholder pods keep build starts
instant. ``service`` holds the formulas and the reads, ``router`` the route."""
