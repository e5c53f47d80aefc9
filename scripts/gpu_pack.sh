#!/bin/bash
# Sourced by the GPU scripts: what a device call brings back from a results folder.
#   trim_logs DIR          every *.log over 20 kB under DIR becomes its last 20 kB, as NAME.log.tail
#   pack_folder DIR TGZ    trim_logs DIR, then DIR's contents into TGZ, and DIR removed
trim_logs() {
  find "$1" -name '*.log' -size +20k -exec sh -c 'tail -c 20000 "$1" > "$1.tail"; rm "$1"' _ {} \;
}
pack_folder() {
  trim_logs "$1"
  tar czf "$2" -C "$1" . && rm -rf "$1"
}
