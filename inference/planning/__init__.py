"""The planning loop: imagination (propose, roll out, judge), the episode loop (act, watch, pivot), its config,
router, env oracle and trace."""
