"""The probe conformance kit.

It holds the pytest plugin a plugin's author runs (testing.py) and the live checks of what the
providers do (providers.py)."""
