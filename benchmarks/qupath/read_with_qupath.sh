#!/usr/bin/env bash
# Read GeoJSON files with QuPath's own GeoJSON reader, compiled from QuPath's source at a tag.
#   QUPATH_SRC=path/to/a/qupath/clone M2=~/.m2/repository bash read_with_qupath.sh v0.6.0 FILE...
# Needs a JDK 21 or newer (javac, java) and, in the Maven cache M2, the jars qupath-core uses
# here: gson, jts-core, slf4j-api, guava, commons-math3. picocli and ImageJ, which the reader
# never calls, are replaced by the stand-ins in stubs/. Nothing of QuPath is kept in this repo.
set -euo pipefail
tag=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$QUPATH_SRC" archive "$tag" qupath-core/src/main/java | tar -x -C "$work"
jar() { find "$M2" -path "*$1*" -name "*.jar" | sort | tail -1; }
cp="$(jar gson/gson/2.13):$(jar jts-core/1.20):$(jar slf4j-api/2.0):$(jar guava/guava/33):$(jar commons-math3)"
javac -nowarn -proc:none --release 21 -d "$work/out" -cp "$cp" \
  -sourcepath "$work/qupath-core/src/main/java:$here/stubs" "$here/ReadCyto.java" 2>&1 | grep -v '^Note:' || true
java -Xmx4g -cp "$work/out:$cp" ReadCyto "$@" 2>&1 | grep -v '^SLF4J'
