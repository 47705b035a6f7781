"""Nexmark, the standard streaming benchmark: an online auction's people, auctions and
bids (:mod:`.generator`, written from the specification), and its queries
(:mod:`.queries`) as driftstream flows. ``driftstream bench nexmark`` runs them."""
