{{/* The extender's TLS objects as JSON: {"server": <Secret data>, "client": <Secret data>,
"ca": <PEM>}. Read back with lookup (kept on upgrade) or made, once per render: the result is
kept in .Values, so secrets.yaml and the pod templates' checksums see the same certificates
(a second genCA would make others). The client Secret keeps the CN its certificate was made
for (common-name): a changed extender.tls.clientCommonName would otherwise leave a certificate
the extender's --allowed-client no longer accepts, so the render fails and says what to do. */}}
{{- define "hcs.extenderTLS" -}}
{{- if not (hasKey .Values "hcsExtenderTLSRendered") -}}
{{- $ns := .Release.Namespace -}}
{{- $tls := .Values.extender.tls -}}
{{- $server := lookup "v1" "Secret" $ns $tls.secretName -}}
{{- $client := lookup "v1" "Secret" $ns $tls.clientSecretName -}}
{{- $bundle := lookup "v1" "ConfigMap" $ns $tls.caConfigMapName -}}
{{- $found := compact (list (and $server "s") (and $client "c") (and $bundle "b")) -}}
{{- if and $found (lt (len $found) 3) -}}
{{- fail (printf "%s, %s and ConfigMap %s are made together and only some exist in %s: delete the rest to have all three made again" $tls.secretName $tls.clientSecretName $tls.caConfigMapName $ns) -}}
{{- end -}}
{{- $files := dict -}}
{{- if $server -}}
{{- $kept := index $client.data "common-name" | default "" | b64dec -}}
{{- if and $kept (ne $kept $tls.clientCommonName) -}}
{{- fail (printf "extender.tls.clientCommonName is %q but the kept client certificate in %s was made for %q: delete %s, %s and ConfigMap %s in %s to have them made again for the new name (then hcs-scheduler and the extender restart with them), or set it back" $tls.clientCommonName $tls.clientSecretName $kept $tls.secretName $tls.clientSecretName $tls.caConfigMapName $ns) -}}
{{- end -}}
{{- $_ := set $files "server" $server.data -}}
{{- $_ := set $files "client" $client.data -}}
{{- $_ := set $files "ca" (index $bundle.data "ca.crt") -}}
{{- else -}}
{{- /* A CA for this alone (not the cluster's: docs/cluster.md, Security); its key is not kept. */ -}}
{{- $ca := genCA "hcs-scheduler-extender-ca" (int $tls.validityDays) -}}
{{- $host := include "hcs.extenderHost" . -}}
{{- $names := list $host (printf "%s.cluster.local" $host) -}}
{{- $ips := list -}}
{{- with .Values.extenderAddress -}}{{/* clusters without cluster DNS: the address they call */}}
{{- if regexMatch "^[0-9.]+$|:" . -}}{{- $ips = list . -}}{{- else -}}{{- $names = append $names . -}}{{- end -}}
{{- end -}}
{{- $cert := genSignedCert "hcs-scheduler-extender" $ips $names (int $tls.validityDays) $ca -}}
{{- $scheduler := genSignedCert $tls.clientCommonName nil nil (int $tls.validityDays) $ca -}}
{{- $_ := set $files "server" (dict "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc) "client-ca.crt" ($ca.Cert | b64enc)) -}}
{{- $_ := set $files "client" (dict "tls.crt" ($scheduler.Cert | b64enc) "tls.key" ($scheduler.Key | b64enc) "ca.crt" ($ca.Cert | b64enc) "common-name" ($tls.clientCommonName | b64enc)) -}}
{{- $_ := set $files "ca" $ca.Cert -}}
{{- end -}}
{{- $_ := set .Values "hcsExtenderTLSRendered" ($files | toJson) -}}
{{- end -}}
{{- .Values.hcsExtenderTLSRendered -}}
{{- end }}

{{/* A pod template annotation that changes when the certificates `part` (server, client)
does: kube-scheduler reads its caFile once, so a renewed CA needs new pods. Only for
certificates the chart makes; bring-your-own ones: restart by hand (docs/helm.md). */}}
{{- define "hcs.tlsChecksum" -}}
{{- if .root.Values.extender.tls.generate -}}
checksum/tls: {{ index (include "hcs.extenderTLS" .root | fromJson) .part | toJson | sha256sum | trunc 16 | quote }}
{{- end -}}
{{- end }}
