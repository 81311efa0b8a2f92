# shellcheck shell=bash
# Shared by the infra/ launch scripts (sourced, not run): argument checks and the dry-run switch.
#
# Every script parses its flags into variables, then calls `run CMD ARGS...` for each side
# effect. With --dry-run, `run` prints the command (shell-quoted, one line, prefixed "+ ") and
# does nothing; otherwise it prints the same line to stderr and runs it. `die` ends with exit
# code 2 and one line naming the flag.

DRY_RUN=${DRY_RUN:-0}

die() {
  echo "$(basename "$0"): $*" >&2
  exit 2
}

# require VALUE --flag: fail naming --flag when VALUE is empty
require() {
  [[ -n "$1" ]] || die "missing required argument $2 (see --help)"
}

# need_value FLAG "$@": the flag at $1 has a value after it
need_value() {
  [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || die "$1 needs a value"
}

# quote ARGS...: one line a shell reads back as the same words, whatever they hold: plain words
# bare, others in '' (a ' inside as '\''), and a word with a control character (a newline, a
# tab, an escape) as bash's printf %q writes it ($'...'), so that the line stays one line.
# Nothing in a value ($(...), backticks, quotes, ;, spaces) is ever read as shell syntax:
# pasting a dry run's "+ " lines into bash runs exactly the commands shown.
quote() {
  local out="" arg q="'" word
  for arg in "$@"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
      out+="$arg "
    elif [[ "$arg" == *[[:cntrl:]]* ]]; then
      printf -v word '%q' "$arg"
      out+="$word "
    else
      out+="'${arg//$q/$q\\$q$q}' "
    fi
  done
  printf '%s' "${out% }"
}

run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    echo "+ $(quote "$@")"
  else
    echo "+ $(quote "$@")" >&2
    "$@"
  fi
}

# gs_url VALUE --flag: VALUE is a gs:// URL
gs_url() {
  [[ "$1" == gs://* ]] || die "$2 must be a gs:// URL, got '$1'"
}
