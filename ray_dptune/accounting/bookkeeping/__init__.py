"""A search's account: its mechanism, plans and spends, attempts, guarantee, budget and calibration."""
