"""The lab: simulated B200 hosts (systemd-nspawn, real systemd, sshd and apt) and the site
around them (NVIDIA's apt repository layout, an S3 endpoint, a wheelhouse), on one machine.

The lab imitates the world; product code does not know it exists. Everything here needs root.
"""
