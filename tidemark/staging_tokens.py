"""The documented default credentials of the staging servers.

They are in staging/, shared by the servers, which accept them, and by worker configuration
(activities/wiring.py), which presents them when ``TIDEMARK_STAGING_URL`` points a target at
staging. Kept here so that worker code never imports the staging servers themselves. None of these
is a secret: staging accepts them from anyone.
"""

DRIVE_WRITE = "staging-drive-write"  # auth/drive
DRIVE_READ = "staging-drive-read"  # auth/drive.metadata.readonly

GMAIL_COMPOSE = "staging-gmail-compose"  # gmail.compose: what gmail.send writes with (drafts)
GMAIL_SEND = "staging-gmail-send"  # gmail.send only: messages.send, no drafts
GMAIL_READ = "staging-gmail-readonly"  # gmail.readonly
GMAIL_METADATA = "staging-gmail-metadata"  # gmail.metadata

GRAPH_SEND = "staging-graph-send"  # Mail.Send, Mail.ReadWrite, User.Read
GRAPH_READ = "staging-graph-read"  # Mail.Read, User.Read

STRIPE_SECRET = "sk_test_tidemark_staging"  # a test-mode secret key
STRIPE_READ = "rk_test_tidemark_staging_read"  # a test-mode restricted key that only reads
