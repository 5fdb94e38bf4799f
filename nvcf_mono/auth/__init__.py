"""Who is calling, and what they may do: principals, scopes, the strategy chain, keys and tokens.

Shared by the control and invocation planes. The strategies themselves are plugins
(``nvcf_mono/plugins/auth_*.py``) that contribute to :data:`~nvcf_mono.auth.strategy.AUTH_STRATEGIES`.
"""
