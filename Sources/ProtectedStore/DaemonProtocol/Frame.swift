import Foundation

/// One protocol frame (docs/PROTOCOL.md §2): a JSON message and, when a secret travels, a binary attachment that is
/// decoded straight into guarded memory, so secrets never pass through JSON strings.
struct Frame {
    /// Largest payload (everything after the 4-byte length) either side accepts.
    static let maximumPayload = 64 * 1024
    static let lengthBytes = 4
    static let messageLengthBytes = 2

    var message: [UInt8]
    var attachment: SecureBytes?

    /// A frame whose bytes break the framing rules; the connection is closed after one error reply.
    struct Malformed: Error, CustomStringConvertible {
        let description: String
    }

    /// Encodes `message` (with `attachment`) into the bytes to send; the caller zeroes them once sent when there is an attachment.
    static func encode(_ message: some Encodable, attachment: SecureBytes? = nil) throws -> [UInt8] {
        let json = Array(try JSONEncoder().encode(message))
        let attachmentCount = attachment?.count ?? 0
        let payload = messageLengthBytes + json.count + attachmentCount
        precondition(json.count <= Int(UInt16.max) && payload <= maximumPayload, "frame too large to send")
        var bytes = [UInt8]()
        bytes.reserveCapacity(lengthBytes + payload)
        bytes.append(contentsOf: bigEndianBytes(UInt32(payload)))
        bytes.append(contentsOf: bigEndianBytes(UInt16(json.count)))
        bytes.append(contentsOf: json)
        if let attachment {
            try attachment.withUnsafeBytes { bytes.append(contentsOf: $0) }
        }
        return bytes
    }

    /// Decodes the frame at the start of `buffer`: nil while it is incomplete, else the frame and the bytes it used.
    /// Throws `Malformed` for a length over the maximum or a message length that does not fit the payload.
    static func decode(_ buffer: UnsafeRawBufferPointer) throws -> (frame: Frame, consumed: Int)? {
        guard buffer.count >= lengthBytes else { return nil }
        let payload = Int(buffer[0]) << 24 | Int(buffer[1]) << 16 | Int(buffer[2]) << 8 | Int(buffer[3])
        guard payload <= maximumPayload else {
            throw Malformed(description: "frame of \(payload) bytes exceeds the maximum of \(maximumPayload)")
        }
        guard payload >= messageLengthBytes else {
            throw Malformed(description: "frame of \(payload) bytes is too short to hold a message length")
        }
        guard buffer.count >= lengthBytes + payload else { return nil }
        let messageCount = Int(buffer[4]) << 8 | Int(buffer[5])
        guard messageCount <= payload - messageLengthBytes else {
            throw Malformed(description: "message length \(messageCount) exceeds the frame's payload of \(payload) bytes")
        }
        let messageStart = lengthBytes + messageLengthBytes
        let attachmentStart = messageStart + messageCount
        let attachmentCount = lengthBytes + payload - attachmentStart
        let attachment = attachmentCount == 0 ? nil : SecureBytes(count: attachmentCount) { secret in
            secret.copyMemory(from: UnsafeRawBufferPointer(rebasing: buffer[attachmentStart..<attachmentStart + attachmentCount]))
        }
        return (Frame(message: Array(buffer[messageStart..<attachmentStart]), attachment: attachment), lengthBytes + payload)
    }

    private static func bigEndianBytes<T: FixedWidthInteger>(_ value: T) -> [UInt8] {
        withUnsafeBytes(of: value.bigEndian) { Array($0) }
    }
}

/// Bytes received on a connection and not yet decoded; consumed bytes are zeroed, since attachments carry secrets.
struct ReceiveBuffer {
    private var bytes: [UInt8] = []

    var count: Int { bytes.count }

    mutating func append(_ chunk: UnsafeRawBufferPointer) { bytes.append(contentsOf: chunk) }

    /// The next complete frame, if one has arrived.
    mutating func nextFrame() throws -> Frame? {
        let decoded = try bytes.withUnsafeBytes { try Frame.decode($0) }
        guard let (frame, consumed) = decoded else { return nil }
        zeroize(&bytes, count: consumed)
        bytes.removeFirst(consumed)
        return frame
    }

    /// Zeroes everything still buffered (the connection is closing).
    mutating func wipe() {
        zeroize(&bytes, count: bytes.count)
        bytes = []
    }
}
