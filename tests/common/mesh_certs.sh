# mesh_certs DIR NODE... : a CA for this run (DIR/ca.crt, DIR/ca.key) and, per
# node, DIR/NODE/{ca.crt,tls.crt,tls.key}: the layout of mesh.cert_dir, the
# node name as the certificate's DNS SAN, for client and server use. Sourced
# by the mesh scripts (tests/mesh/, tests/vm/). Needs openssl.
mesh_certs() {
  local dir=$1 n
  shift
  mkdir -p "$dir"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=podlink-test-ca \
    -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
  for n in "$@"; do
    mkdir -p "$dir/$n"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$n" \
      -keyout "$dir/$n/tls.key" -out "$dir/$n/tls.csr" 2>/dev/null
    printf 'subjectAltName=DNS:%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$n" > "$dir/$n/ext.cnf"
    openssl x509 -req -in "$dir/$n/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial -days 1 \
      -extfile "$dir/$n/ext.cnf" -out "$dir/$n/tls.crt" 2>/dev/null
    cp "$dir/ca.crt" "$dir/$n/ca.crt"
    rm -f "$dir/$n/tls.csr" "$dir/$n/ext.cnf"
  done
}
