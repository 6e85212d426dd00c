#!/bin/sh
# As the image's own: with nginx as the command, the scripts in
# /docker-entrypoint.d run first; then the command replaces the shell.
set -e
if [ "$1" = nginx ] || [ "$1" = nginx-debug ]; then
    for f in /docker-entrypoint.d/*.sh; do
        [ -x "$f" ] && echo "$0: running $f" && "$f"
    done
    echo "$0: ready for start up"
fi
exec "$@"
