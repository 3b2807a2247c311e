"""The ``ray-dptune`` command: plan a search, calibrate its noise, read journals and ledgers."""
