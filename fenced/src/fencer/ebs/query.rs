//! [`Ec2Volumes`] over the EC2 Query API (API version 2016-11-15): two form-encoded
//! `POST`s signed with SigV4, XML answers.
//!
//! The fencer needs exactly two EC2 operations. The generated AWS SDK client for EC2
//! carries all of them (about 90 MB of source, a 1.4 GB debug artifact, minutes of
//! build per configuration), so this module speaks the Query protocol itself and keeps
//! AWS's own crates for everything where a mistake would be subtle: `aws-config` resolves
//! credentials and region (environment, profile, web identity, ECS, IMDSv2) and
//! `aws-sigv4` signs. What is left here is building two forms and reading two answers.
//!
//! - **Endpoint**: the configured override (`--ebs-endpoint-url`, `AWS_ENDPOINT_URL`),
//!   else the regional endpoint `https://ec2.<region>.amazonaws.com` (`ec2-fips.` with
//!   FIPS, `.api.aws` with dual-stack, `.amazonaws.com.cn` in China regions). Other
//!   partitions need the override.
//! - **Timeouts**: the SDK config's connect and per-attempt timeouts bound every call.
//!   There are no retries in here: the fence loop ([`super::EbsFencer::sever`]) retries
//!   throttled and transient failures inside its own deadline, and knows when a resend
//!   is safe.
//! - **Credentials** are cached until five minutes before they expire, as the SDK's
//!   identity cache does, so an instance-profile fencer does not ask IMDS on every call.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::{AttachmentView, Ec2Error, Ec2ErrorKind, Ec2Op, Ec2Volumes, Transport, VolumeView};
use super::{classify, classify_credentials};
use crate::fencer::BoxFuture;

/// The EC2 API version this client speaks.
pub const API_VERSION: &str = "2016-11-15";

/// Largest answer read (a `DescribeVolumes` of one volume is a few KiB).
const MAX_ANSWER: usize = 1 << 20;

/// Credentials are refreshed this long before they expire.
const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(300);

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// [`Ec2Volumes`] on the EC2 Query API, configured from a loaded `aws_config::SdkConfig`.
pub struct Ec2Client {
    http: Client<Https, Full<Bytes>>,
    endpoint: String,
    region: String,
    credentials: SharedCredentialsProvider,
    cached: Mutex<Option<Credentials>>,
    attempt_timeout: Duration,
}

impl fmt::Debug for Ec2Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the credentials.
        f.debug_struct("Ec2Client")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("attempt_timeout", &self.attempt_timeout)
            .finish_non_exhaustive()
    }
}

/// Why an [`Ec2Client`] could not be built from an SDK config.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// No region in the config (and no endpoint override to sign for).
    #[error("no AWS region: pass --ebs-region or set AWS_REGION")]
    NoRegion,
    /// No credentials provider in the config.
    #[error("no AWS credentials provider configured")]
    NoCredentials,
    /// The endpoint is not an `http(s)://host[:port][/]` URL.
    #[error("EC2 endpoint {0:?} is not an http(s) URL without a path or query")]
    BadEndpoint(String),
    /// A plain `http://` endpoint that is not on this host: the signed requests and the
    /// session token would cross the network in clear text.
    #[error(
        "EC2 endpoint {0:?} is plain http to a host other than loopback: requests carry the signature and the session token in clear text; use https:// (plain http is allowed only to 127.0.0.0/8, ::1 and localhost, for test peers)"
    )]
    PlainHttp(String),
    /// The system's trust roots could not be loaded.
    #[error("cannot load the system's TLS trust roots: {0}")]
    TlsRoots(#[source] std::io::Error),
}

/// Whether `host` (as in a URL: IPv6 in brackets) names this host: `localhost`,
/// 127.0.0.0/8 or `::1`.
pub fn is_loopback_host(host: &str) -> bool {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The regional EC2 endpoint for `region`.
pub fn regional_endpoint(region: &str, fips: bool, dual_stack: bool) -> String {
    let service = if fips { "ec2-fips" } else { "ec2" };
    let suffix = if region.starts_with("cn-") {
        if dual_stack {
            "api.amazonwebservices.com.cn"
        } else {
            "amazonaws.com.cn"
        }
    } else if dual_stack {
        "api.aws"
    } else {
        "amazonaws.com"
    };
    format!("https://{service}.{region}.{suffix}")
}

impl Ec2Client {
    /// A client using `sdk`'s region, credentials, endpoint override and timeouts.
    pub fn new(sdk: &aws_config::SdkConfig) -> Result<Self, ClientError> {
        let region = sdk
            .region()
            .map(|r| r.as_ref().to_owned())
            .ok_or(ClientError::NoRegion)?;
        let credentials = sdk
            .credentials_provider()
            .ok_or(ClientError::NoCredentials)?;
        let endpoint = match sdk.endpoint_url() {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => regional_endpoint(
                &region,
                sdk.use_fips().unwrap_or(false),
                sdk.use_dual_stack().unwrap_or(false),
            ),
        };
        let uri: http::Uri = endpoint
            .parse()
            .map_err(|_| ClientError::BadEndpoint(endpoint.clone()))?;
        let plain_origin = matches!(uri.scheme_str(), Some("http" | "https"))
            && uri.host().is_some()
            && uri.query().is_none()
            && matches!(uri.path(), "" | "/");
        if !plain_origin {
            return Err(ClientError::BadEndpoint(endpoint));
        }
        if uri.scheme_str() == Some("http") && !uri.host().is_some_and(is_loopback_host) {
            return Err(ClientError::PlainHttp(endpoint));
        }
        let timeouts = sdk.timeout_config();
        let connect_timeout = timeouts
            .and_then(|t| t.connect_timeout())
            .unwrap_or(Duration::from_secs(3));
        let attempt_timeout = timeouts
            .and_then(|t| t.operation_attempt_timeout())
            .unwrap_or(Duration::from_secs(10));

        let mut tcp = HttpConnector::new();
        tcp.set_connect_timeout(Some(connect_timeout));
        tcp.set_nodelay(true);
        tcp.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(rustls::crypto::aws_lc_rs::default_provider())
            .map_err(ClientError::TlsRoots)?
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(https);
        Ok(Self {
            http,
            endpoint,
            region,
            credentials,
            cached: Mutex::new(None),
            attempt_timeout,
        })
    }

    /// The endpoint requests go to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    async fn credentials(&self, op: Ec2Op) -> Result<Credentials, Ec2Error> {
        let fresh = |c: &Credentials| {
            c.expiry()
                .is_none_or(|exp| exp > SystemTime::now() + REFRESH_BEFORE_EXPIRY)
        };
        if let Some(c) = self.cached.lock().expect("credentials cache").as_ref()
            && fresh(c)
        {
            return Ok(c.clone());
        }
        let got =
            tokio::time::timeout(self.attempt_timeout, self.credentials.provide_credentials())
                .await;
        match got {
            Ok(Ok(c)) => {
                *self.cached.lock().expect("credentials cache") = Some(c.clone());
                Ok(c)
            }
            Ok(Err(e)) => Err(Ec2Error {
                op,
                kind: classify_credentials(&e),
                code: None,
                message: Some(format!("credentials: {e}")),
                status: None,
                source: Some(Box::new(e)),
            }),
            Err(_) => Err(Ec2Error {
                op,
                kind: Ec2ErrorKind::Transient,
                code: None,
                message: Some(format!(
                    "credentials not provided within {:?}",
                    self.attempt_timeout
                )),
                status: None,
                source: None,
            }),
        }
    }

    /// One signed call: returns the answer's body on HTTP 2xx, a classified error
    /// otherwise.
    async fn call(&self, op: Ec2Op, params: &[(&str, &str)]) -> Result<String, Ec2Error> {
        let creds = self.credentials(op).await?;
        let body = query_body(op, params);
        let request = self
            .signed_request(&creds, body)
            .map_err(|e| transport_error(op, Transport::Construction, e))?;
        let answer = tokio::time::timeout(self.attempt_timeout, async {
            let resp = self
                .http
                .request(request)
                .await
                .map_err(|e| transport_error(op, Transport::Dispatch, e))?;
            let status = resp.status().as_u16();
            let bytes = Limited::new(resp.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| transport_error(op, Transport::Response, e))?
                .to_bytes();
            Ok::<_, Ec2Error>((status, bytes))
        })
        .await;
        let (status, bytes) = match answer {
            Ok(r) => r?,
            Err(_) => {
                return Err(Ec2Error {
                    op,
                    kind: classify(Transport::Timeout, None, None),
                    code: None,
                    message: Some(format!("no answer within {:?}", self.attempt_timeout)),
                    status: None,
                    source: None,
                });
            }
        };
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if (200..300).contains(&status) {
            return Ok(text);
        }
        let (code, message) = parse_error(&text);
        let transport = if code.is_some() || status >= 400 {
            Transport::Service
        } else {
            Transport::Response
        };
        Err(Ec2Error {
            op,
            kind: classify(transport, code.as_deref(), Some(status)),
            code,
            message: message.or_else(|| Some(format!("HTTP {status}"))),
            status: Some(status),
            source: None,
        })
    }

    fn signed_request(
        &self,
        creds: &Credentials,
        body: String,
    ) -> Result<http::Request<Full<Bytes>>, Box<dyn std::error::Error + Send + Sync>> {
        const CONTENT_TYPE: &str = "application/x-www-form-urlencoded; charset=utf-8";
        let url = format!("{}/", self.endpoint);
        let uri: http::Uri = url.parse()?;
        let host = uri
            .authority()
            .ok_or("endpoint without a host")?
            .to_string();
        let identity: Identity = creds.clone().into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name("ec2")
            .time(SystemTime::now())
            .settings(SigningSettings::default())
            .build()?
            .into();
        let signable = SignableRequest::new(
            "POST",
            url.as_str(),
            [("host", host.as_str()), ("content-type", CONTENT_TYPE)].into_iter(),
            SignableBody::Bytes(body.as_bytes()),
        )?;
        let (instructions, _signature) = sign(signable, &params)?.into_parts();
        let mut request = http::Request::builder()
            .method("POST")
            .uri(uri)
            .header("host", host)
            .header("content-type", CONTENT_TYPE)
            .body(Full::new(Bytes::from(body)))?;
        instructions.apply_to_request_http1x(&mut request);
        Ok(request)
    }
}

fn transport_error(
    op: Ec2Op,
    transport: Transport,
    e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> Ec2Error {
    let source = e.into();
    Ec2Error {
        op,
        kind: classify(transport, None, None),
        code: None,
        message: Some(source.to_string()),
        status: None,
        source: Some(source),
    }
}

/// The form body of one call: `Action`, `Version`, then `params`.
pub fn query_body(op: Ec2Op, params: &[(&str, &str)]) -> String {
    let mut form = form_urlencoded::Serializer::new(String::new());
    form.append_pair("Action", &op.to_string());
    form.append_pair("Version", API_VERSION);
    for (k, v) in params {
        form.append_pair(k, v);
    }
    form.finish()
}

/// The error code and message of an EC2 error answer
/// (`<Response><Errors><Error><Code>…</Code><Message>…</Message></Error></Errors>…`).
pub fn parse_error(xml: &str) -> (Option<String>, Option<String>) {
    let Ok(doc) = roxmltree::Document::parse(xml) else {
        return (None, None);
    };
    let Some(error) = doc.descendants().find(|n| n.has_tag_name("Error")) else {
        return (None, None);
    };
    (child_text(error, "Code"), child_text(error, "Message"))
}

/// The attachment state in a `DetachVolume` answer (`<status>`), if any. An answer
/// naming another volume or instance than the ones asked about is malformed.
pub fn parse_detach(
    xml: &str,
    volume_id: &str,
    instance_id: &str,
) -> Result<Option<String>, String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| e.to_string())?;
    let root = doc.root_element();
    if !root.has_tag_name("DetachVolumeResponse") {
        return Err(format!(
            "expected DetachVolumeResponse, got {}",
            root.tag_name().name()
        ));
    }
    for (tag, asked) in [("volumeId", volume_id), ("instanceId", instance_id)] {
        if let Some(named) = child_text(root, tag)
            && named != asked
        {
            return Err(format!(
                "DetachVolumeResponse names {tag} {named:?}, asked for {asked}"
            ));
        }
    }
    Ok(child_text(root, "status"))
}

/// `volume_id` in a `DescribeVolumes` answer; `None` when the answer does not list it.
///
/// Only a complete description is evidence: an item without an `attachmentSet` element
/// (EC2 always sends one, empty when nothing is attached), an attachment without an
/// instance id or a state, a volume without a state, or the volume listed twice, is a
/// malformed answer, never "no attachments".
pub fn parse_describe(xml: &str, volume_id: &str) -> Result<Option<VolumeView>, String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| e.to_string())?;
    let root = doc.root_element();
    if !root.has_tag_name("DescribeVolumesResponse") {
        return Err(format!(
            "expected DescribeVolumesResponse, got {}",
            root.tag_name().name()
        ));
    }
    let Some(set) = child(root, "volumeSet") else {
        return Err("DescribeVolumesResponse without volumeSet".to_owned());
    };
    let mut listed =
        children(set, "item").filter(|v| child_text(*v, "volumeId").as_deref() == Some(volume_id));
    let Some(volume) = listed.next() else {
        return Ok(None);
    };
    if listed.next().is_some() {
        return Err(format!("volume {volume_id} listed more than once"));
    }
    let Some(set) = child(volume, "attachmentSet") else {
        return Err(format!(
            "volume {volume_id} listed without attachmentSet (its attachments are unknown)"
        ));
    };
    let nonempty = |node, tag| child_text(node, tag).filter(|t| !t.is_empty());
    let mut attachments = Vec::new();
    for a in children(set, "item") {
        let (Some(instance_id), Some(state)) = (nonempty(a, "instanceId"), nonempty(a, "status"))
        else {
            return Err(format!(
                "volume {volume_id}: an attachment without instanceId or status"
            ));
        };
        attachments.push(AttachmentView { instance_id, state });
    }
    let Some(state) = nonempty(volume, "status") else {
        return Err(format!("volume {volume_id} listed without status"));
    };
    Ok(Some(VolumeView { state, attachments }))
}

fn children<'a, 'i>(
    node: roxmltree::Node<'a, 'i>,
    name: &'static str,
) -> impl Iterator<Item = roxmltree::Node<'a, 'i>> {
    node.children()
        .filter(move |c| c.is_element() && c.tag_name().name() == name)
}

fn child<'a, 'i>(
    node: roxmltree::Node<'a, 'i>,
    name: &'static str,
) -> Option<roxmltree::Node<'a, 'i>> {
    children(node, name).next()
}

fn child_text(node: roxmltree::Node<'_, '_>, name: &'static str) -> Option<String> {
    child(node, name).map(|c| c.text().unwrap_or_default().trim().to_owned())
}

fn malformed(op: Ec2Op, why: String) -> Ec2Error {
    Ec2Error {
        op,
        kind: classify(Transport::Response, None, None),
        code: None,
        message: Some(format!("malformed answer: {why}")),
        status: None,
        source: None,
    }
}

impl Ec2Volumes for Ec2Client {
    fn detach_volume<'a>(
        &'a self,
        volume_id: &'a str,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, Ec2Error>> {
        Box::pin(async move {
            let op = Ec2Op::DetachVolume;
            // `InstanceId` is required: without it a Multi-Attach volume would be
            // detached from every instance.
            let xml = self
                .call(
                    op,
                    &[
                        ("VolumeId", volume_id),
                        ("InstanceId", instance_id),
                        ("Force", "true"),
                    ],
                )
                .await?;
            parse_detach(&xml, volume_id, instance_id).map_err(|why| malformed(op, why))
        })
    }

    fn describe_volume<'a>(
        &'a self,
        volume_id: &'a str,
    ) -> BoxFuture<'a, Result<VolumeView, Ec2Error>> {
        Box::pin(async move {
            let op = Ec2Op::DescribeVolumes;
            let xml = self.call(op, &[("VolumeId.1", volume_id)]).await?;
            match parse_describe(&xml, volume_id) {
                Ok(Some(v)) => Ok(v),
                // Asked by id, EC2 answers InvalidVolume.NotFound for a volume it does not
                // know; an answer that does not list it is taken the same way: never
                // "severed", an error the operator sees.
                Ok(None) => Err(Ec2Error {
                    message: Some(format!("the answer does not list {volume_id}")),
                    ..Ec2Error::new(op, Ec2ErrorKind::VolumeNotFound, None)
                }),
                Err(why) => Err(malformed(op, why)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An SDK configuration for `region` at `url` with static `creds`.
    fn sdk_config(region: &'static str, url: &str, creds: Credentials) -> aws_config::SdkConfig {
        aws_config::SdkConfig::builder()
            .region(aws_config::Region::new(region))
            .endpoint_url(url)
            .credentials_provider(SharedCredentialsProvider::new(creds))
            .build()
    }

    /// An SDK configuration for us-east-1 at `url`.
    fn sdk(url: &str) -> aws_config::SdkConfig {
        sdk_config(
            "us-east-1",
            url,
            Credentials::new("a", "b", None, None, "test"),
        )
    }

    // Answers in the shapes documented in the EC2 API reference (DetachVolume,
    // DescribeVolumes, "Error codes for the Amazon EC2 API").

    #[test]
    fn form_body_is_encoded_in_order() {
        assert_eq!(
            query_body(
                Ec2Op::DetachVolume,
                &[
                    ("VolumeId", "vol-1"),
                    ("InstanceId", "i-2"),
                    ("Force", "true")
                ]
            ),
            "Action=DetachVolume&Version=2016-11-15&VolumeId=vol-1&InstanceId=i-2&Force=true"
        );
        assert_eq!(
            query_body(Ec2Op::DescribeVolumes, &[("VolumeId.1", "a b&c")]),
            "Action=DescribeVolumes&Version=2016-11-15&VolumeId.1=a+b%26c"
        );
    }

    #[test]
    fn detach_answer_state() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<DetachVolumeResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>59dbff89-35bd-4eac-99ed-be587EXAMPLE</requestId>
  <volumeId>vol-1234567890abcdef0</volumeId>
  <instanceId>i-1234567890abcdef0</instanceId>
  <device>/dev/sdh</device>
  <status>detaching</status>
  <attachTime>2008-05-07T12:51:50.000Z</attachTime>
</DetachVolumeResponse>"#;
        let parse = |xml| parse_detach(xml, "vol-1234567890abcdef0", "i-1234567890abcdef0");
        assert_eq!(parse(xml).unwrap().as_deref(), Some("detaching"));
        assert!(parse("<Other/>").is_err());
        assert!(parse("not xml").is_err());
        // An answer about another attachment is not an answer to ours.
        let other = xml.replace("i-1234567890abcdef0", "i-0000000000000000f");
        assert!(parse(&other).unwrap_err().contains("instanceId"));
    }

    #[test]
    fn describe_answer_lists_attachments_of_the_asked_volume_only() {
        let xml = r#"<DescribeVolumesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>r</requestId>
  <volumeSet>
    <item>
      <volumeId>vol-other</volumeId><status>available</status><attachmentSet/>
    </item>
    <item>
      <volumeId>vol-1</volumeId>
      <size>80</size>
      <status>in-use</status>
      <attachmentSet>
        <item><volumeId>vol-1</volumeId><instanceId>i-a</instanceId><device>/dev/sdh</device><status>attached</status></item>
        <item><volumeId>vol-1</volumeId><instanceId>i-b</instanceId><device>/dev/sdh</device><status>detaching</status></item>
      </attachmentSet>
      <tagSet><item><key>status</key><value>not-a-volume-state</value></item></tagSet>
    </item>
  </volumeSet>
</DescribeVolumesResponse>"#;
        let v = parse_describe(xml, "vol-1").unwrap().unwrap();
        assert_eq!(v.state, "in-use");
        assert_eq!(
            v.attachments,
            vec![
                AttachmentView {
                    instance_id: "i-a".into(),
                    state: "attached".into()
                },
                AttachmentView {
                    instance_id: "i-b".into(),
                    state: "detaching".into()
                },
            ]
        );
        assert_eq!(parse_describe(xml, "vol-2").unwrap(), None);
        let other = parse_describe(xml, "vol-other").unwrap().unwrap();
        assert!(other.attachments.is_empty());
        assert!(parse_describe("<DescribeVolumesResponse/>", "vol-1").is_err());
    }

    /// Absence of evidence is not evidence: every incomplete description of the volume
    /// is an error, never an empty attachment list.
    #[test]
    fn incomplete_describe_answers_are_malformed() {
        let answer = |item: &str| {
            format!(
                "<DescribeVolumesResponse><volumeSet>{item}</volumeSet></DescribeVolumesResponse>"
            )
        };
        let att = "<item><volumeId>vol-1</volumeId><instanceId>i-a</instanceId><status>attached</status></item>";
        let ok = answer(&format!(
            "<item><volumeId>vol-1</volumeId><status>in-use</status><attachmentSet>{att}</attachmentSet></item>"
        ));
        assert_eq!(
            parse_describe(&ok, "vol-1")
                .unwrap()
                .unwrap()
                .attachments
                .len(),
            1
        );
        let empty = answer(
            "<item><volumeId>vol-1</volumeId><status>available</status><attachmentSet/></item>",
        );
        assert!(
            parse_describe(&empty, "vol-1")
                .unwrap()
                .unwrap()
                .attachments
                .is_empty()
        );
        let cases = [
            // No attachmentSet element at all.
            answer("<item><volumeId>vol-1</volumeId><status>in-use</status></item>"),
            // An attachment without its instance, or without its state.
            answer(
                "<item><volumeId>vol-1</volumeId><status>in-use</status><attachmentSet>\
                 <item><status>attached</status></item></attachmentSet></item>",
            ),
            answer(
                "<item><volumeId>vol-1</volumeId><status>in-use</status><attachmentSet>\
                 <item><instanceId>i-a</instanceId><status> </status></item></attachmentSet></item>",
            ),
            // No volume state.
            answer(&format!(
                "<item><volumeId>vol-1</volumeId><attachmentSet>{att}</attachmentSet></item>"
            )),
            // Listed twice (which one is true?).
            answer(&format!(
                "<item><volumeId>vol-1</volumeId><status>available</status><attachmentSet/></item>\
                 <item><volumeId>vol-1</volumeId><status>in-use</status><attachmentSet>{att}</attachmentSet></item>"
            )),
            // Truncated.
            ok[..ok.len() / 2].to_owned(),
        ];
        for xml in &cases {
            assert!(parse_describe(xml, "vol-1").is_err(), "accepted: {xml}");
        }
    }

    #[test]
    fn plain_http_only_to_loopback() {
        for host in ["127.0.0.1", "127.1.2.3", "[::1]", "localhost", "LOCALHOST"] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "10.0.0.1",
            "example.com",
            "127.0.0.1.example.com",
            "[::2]",
            "0.0.0.0",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
        for ok in [
            "http://127.0.0.1:5000",
            "http://localhost:5000/",
            "http://[::1]:9",
            "https://vpce.example",
        ] {
            assert!(Ec2Client::new(&sdk(ok)).is_ok(), "{ok}");
        }
        for bad in [
            "http://ec2.us-east-1.amazonaws.com",
            "http://10.1.2.3:80",
            "http://127.0.0.1.nip.io",
        ] {
            let e = Ec2Client::new(&sdk(bad)).unwrap_err();
            assert!(matches!(e, ClientError::PlainHttp(_)), "{bad}: {e}");
            assert!(e.to_string().contains("clear text"), "{e}");
        }
    }

    #[test]
    fn error_answer_code_and_message() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>InvalidVolume.NotFound</Code><Message>The volume 'vol-1' does not exist.</Message></Error></Errors><RequestID>ea966190-f9aa-478e-9ede-example</RequestID></Response>"#;
        let (code, msg) = parse_error(xml);
        assert_eq!(code.as_deref(), Some("InvalidVolume.NotFound"));
        assert_eq!(msg.as_deref(), Some("The volume 'vol-1' does not exist."));
        assert_eq!(parse_error("<html>bad gateway</html>"), (None, None));
        assert_eq!(parse_error(""), (None, None));
    }

    #[test]
    fn regional_endpoints() {
        assert_eq!(
            regional_endpoint("us-east-1", false, false),
            "https://ec2.us-east-1.amazonaws.com"
        );
        assert_eq!(
            regional_endpoint("us-gov-west-1", true, false),
            "https://ec2-fips.us-gov-west-1.amazonaws.com"
        );
        assert_eq!(
            regional_endpoint("eu-west-1", false, true),
            "https://ec2.eu-west-1.api.aws"
        );
        assert_eq!(
            regional_endpoint("cn-north-1", false, false),
            "https://ec2.cn-north-1.amazonaws.com.cn"
        );
    }

    #[tokio::test]
    async fn a_signed_request_carries_sigv4_for_ec2_in_the_region() {
        let config = sdk_config(
            "eu-west-3",
            "http://127.0.0.1:9",
            Credentials::new("AKIDEXAMPLE", "secret", Some("token".into()), None, "test"),
        );
        let c = Ec2Client::new(&config).unwrap();
        let creds = c.credentials(Ec2Op::DescribeVolumes).await.unwrap();
        let req = c
            .signed_request(
                &creds,
                query_body(Ec2Op::DescribeVolumes, &[("VolumeId.1", "vol-1")]),
            )
            .unwrap();
        let h = req.headers();
        let auth = h["authorization"].to_str().unwrap();
        assert!(
            auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"),
            "{auth}"
        );
        assert!(auth.contains("/eu-west-3/ec2/aws4_request"), "{auth}");
        assert!(auth.contains("SignedHeaders=content-type;host;"), "{auth}");
        assert_eq!(h["x-amz-security-token"], "token");
        assert!(h.contains_key("x-amz-date"));
        assert_eq!(req.uri().to_string(), "http://127.0.0.1:9/");
        assert!(format!("{c:?}").contains("127.0.0.1:9"));
        assert!(!format!("{c:?}").contains("secret"));
    }

    #[test]
    fn endpoints_with_a_path_are_refused() {
        assert!(Ec2Client::new(&sdk("https://ec2.example:8443/")).is_ok());
        for bad in ["ftp://x", "https://x/path", "https://x/?a=b", "nonsense"] {
            assert!(
                matches!(Ec2Client::new(&sdk(bad)), Err(ClientError::BadEndpoint(_))),
                "{bad}"
            );
        }
        let no_region = aws_config::SdkConfig::builder().build();
        assert!(matches!(
            Ec2Client::new(&no_region),
            Err(ClientError::NoRegion)
        ));
    }
}
