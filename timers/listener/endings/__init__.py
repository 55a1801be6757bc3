"""How runs ended: the writer that records endings in Redis, the journal that keeps them on
local disk first, and the history kept of them."""
